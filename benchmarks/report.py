"""Markdown tables from benchmark records (what docs/benchmarks.md holds)."""

from __future__ import annotations

from typing import Any

LABELS = {
    "evolm": "(a) evolm local engine, one batch, N adapters",
    "base": "(b) same engine and batch, base model only",
    "evolm_fp8": "(a8) as (a), quantization=fp8 (fp8 projection GEMMs)",
    "base_fp8": "(b8) as (b), quantization=fp8",
    "paper": "(c) paper's method: perturb weights per member, HF generate, restore",
    "paper_fast": "(c') paper's method generating with evolm's engine",
    "hf_lora": "(d) one HF generate per member with its LoRA",
    "external": "(e) evolm with server=sglang",
}
GB = 2**30


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def title(record: dict[str, Any]) -> str:
    w, m = record["workload"], record["machine"]
    return (
        f"{w['shape']}, N={w['members']} x P={w['prompts']}, prompt {w['prompt_len']}, "
        f"{w['new_tokens']} new tokens forced, rank {w['rank']}, {w['dtype']} on {m['device']}"
    )


def methods_table(record: dict[str, Any]) -> list[str]:
    results = record["results"]
    a = results.get("evolm", {}).get("seconds")
    lines = ["| method | s / generation | tokens/s | x (a) |", "|---|---:|---:|---:|"]
    for name, r in results.items():
        note = f" ({r['members_timed']} members timed, scaled)" if "members_timed" in r else ""
        ratio = r["seconds"] / a if a else None
        lines.append(
            f"| {LABELS[name]}{note} | {_f(r['seconds'], 3)} | {r['tokens_per_s']:,.0f} "
            f"| {_f(ratio)} |"
        )
    return lines


def metrics_table(record: dict[str, Any]) -> list[str]:
    a = record["results"].get("evolm", {})
    ratios, book, mem = record["ratios"], record["bookkeeping"], record["memory"]
    roof, check = record.get("roofline", {}), record.get("check", {})
    rows = [
        (
            "prefill s / decode ms per step (a)",
            f"{_f(a.get('prefill_s'), 3)} / {_f(a.get('decode_ms_per_step'))}",
        ),
        ("LoRA overhead (a)/(b) - 1", f"{100 * ratios.get('lora_overhead', float('nan')):.1f}%"),
        ("(c)/(a) paper's method / evolm", _f(ratios.get("paper_over_evolm"), 1)),
        ("(d)/(a) per-member HF LoRA / evolm", _f(ratios.get("hf_lora_over_evolm"), 1)),
        (
            "ES sample + tell + engine adapter load s (share of (a))",
            f"{_f(book['sample_s'], 3)} + {_f(book['tell_s'], 3)} + "
            f"{_f(book.get('engine_load_s', 0.0), 3)} "
            f"({100 * ratios.get('bookkeeping_share', float('nan')):.1f}%)",
        ),
        ("adapter writes for servers, s", _f(book.get("adapter_write_s"), 3)),
    ]
    if "fp8_speedup" in ratios:
        rows.append(
            (
                "with quantization=fp8: (a)/(a8), LoRA overhead (a8)/(b8) - 1",
                f"{_f(ratios['fp8_speedup'])}, "
                + (
                    f"{100 * ratios['lora_overhead_fp8']:.1f}%"
                    if "lora_overhead_fp8" in ratios
                    else "-"
                ),
            )
        )
    if "peak_bytes" in mem:
        rows.append(
            (
                "peak GPU memory / (weights + KV + adapters)",
                f"{mem['peak_bytes'] / GB:.2f} GiB / ({mem['weights_bytes'] / GB:.2f} + "
                f"{mem['kv_cache_bytes'] / GB:.2f} + {mem['adapter_bytes'] / GB:.2f}) = "
                f"{mem['peak_over_needed']:.2f}x",
            )
        )
    if roof and a:
        rows.append(
            (
                "roofline floor s (compute / memory); floor/(a)",
                f"{roof['floor_s']:.3f} ({roof['compute_s']:.3f} / {roof['memory_s']:.3f}); "
                f"{100 * roof['floor_s'] / a['seconds']:.0f}%",
            )
        )
    if check:
        rows.append(
            (
                "fast vs HF logits: max abs diff (max abs logit), argmax agree",
                f"{check['max_abs_diff']:.3g} ({check['ref_max_abs']:.3g}), "
                f"{100 * check['argmax_agree']:.0f}%",
            )
        )
    return ["| metric | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]]


def profile_table(record: dict[str, Any]) -> list[str]:
    if not record.get("profile"):
        return []
    lines = [
        "| kernel (one evolm run, <= 32 new tokens, graphs off) | calls | ms |",
        "|---|---:|---:|",
    ]
    for k in record["profile"]:
        lines.append(f"| `{k['name']}` | {k['count']} | {k['device_ms']:.1f} |")
    return lines


def markdown(records: list[dict[str, Any]]) -> str:
    out: list[str] = []
    for record in records:
        out += [f"### {title(record)}", "", *methods_table(record), "", *metrics_table(record), ""]
        prof = profile_table(record)
        if prof:
            out += [*prof, ""]
    return "\n".join(out)

"""The package's import rules (docs/architecture.md), checked on the real import graph.

grimp builds the graph from the source (module-level, function-level and TYPE_CHECKING imports
alike), so a rule broken anywhere in a module fails here, in CI.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator

import grimp
import pytest

from tests.helpers import REPO

STDLIB = set(sys.stdlib_module_names)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("evolm", include_external_packages=True, cache_dir=None)


def packages(graph: grimp.ImportGraph, root: str = "evolm") -> Iterator[str]:
    """``root`` and every package below it."""
    yield root
    for child in sorted(graph.find_children(root)):
        if graph.find_children(child):
            yield from packages(graph, child)


def within(graph: grimp.ImportGraph, package: str) -> set[str]:
    return {package} | graph.find_descendants(package)


def imported_by(graph: grimp.ImportGraph, package: str) -> set[str]:
    """Every module (evolm's, or a top-level external package) imported from ``package``."""
    out: set[str] = set()
    for module in within(graph, package):
        out |= graph.find_modules_directly_imported_by(module)
    return out - within(graph, package)


def test_no_import_cycles(graph: grimp.ImportGraph) -> None:
    """Among the children of every package, the imports form no cycle."""
    cycles = {pkg: graph.nominate_cycle_breakers(pkg) for pkg in packages(graph)}
    assert not {pkg: found for pkg, found in cycles.items() if found}, (
        "import cycles (importer, imported) to break, per package"
    )


def evolm_imports(graph: grimp.ImportGraph, package: str) -> set[str]:
    """The evolm modules ``package`` imports (outside itself; the package root ``evolm``, which
    holds only the version, aside)."""
    return {m for m in imported_by(graph, package) if m.startswith("evolm.")}


def edges(graph: grimp.ImportGraph, source: str, target: str) -> set[tuple[str, str]]:
    """Direct imports ``(importer, imported)`` from ``source`` (and below) into ``target``."""
    return {
        (a, b)
        for a in within(graph, source)
        for b in graph.find_modules_directly_imported_by(a)
        if b in within(graph, target)
    }


def test_es_core_imports_only_torch_and_errors(graph: grimp.ImportGraph) -> None:
    """The ES core is pure torch: no I/O libraries, nothing else of evolm."""
    allowed = {"torch", "evolm.errors"}
    extra = {m for m in imported_by(graph, "evolm.es") if m not in allowed and m not in STDLIB}
    assert not extra, f"evolm.es imports {sorted(extra)}"


def test_only_dist_imports_torch_distributed(graph: grimp.ImportGraph) -> None:
    """grimp names external packages by their top level (``torch``): the import lines say
    which of them reach ``torch.distributed``."""
    users = {
        module
        for module in graph.find_modules_that_directly_import("torch")
        for detail in graph.get_import_details(importer=module, imported="torch")
        if "torch.distributed" in detail["line_contents"]
    }
    assert users <= {"evolm.dist"}, f"only evolm.dist may import torch.distributed: {users}"


@pytest.mark.parametrize(
    ("source", "forbidden"),
    [
        ("evolm.engine", "evolm.task"),  # engines know sampling settings, never a task
        ("evolm.server", "evolm.task"),
        ("evolm.task", "evolm.server"),  # tasks: no engine, no server
        ("evolm.task", "evolm.engine"),
        ("evolm.lora", "evolm.engine"),
        ("evolm.model", "evolm.engine"),
        ("evolm.engine.fast", "evolm.engine.hf"),  # the fast path samples with engine.sampler
        ("evolm.engine", "evolm.server"),  # the in-process engine knows no server client
        ("evolm.callbacks", "evolm.engine"),  # callbacks see records, not what made them
        ("evolm.callbacks", "evolm.server"),
        ("evolm.callbacks", "evolm.task"),
        ("evolm.callbacks", "evolm.loop"),
        ("evolm.tracking", "evolm.callbacks"),  # storage knows no callback
        ("evolm.checkpoint", "evolm.callbacks"),
    ],
)
def test_forbidden_edges(graph: grimp.ImportGraph, source: str, forbidden: str) -> None:
    found = edges(graph, source, forbidden)
    assert not found, f"{source} must not import {forbidden}: {sorted(found)}"


def test_the_fast_path_imports_no_hf_path(graph: grimp.ImportGraph) -> None:
    found = edges(graph, "evolm.engine.fast", "evolm.engine.hf")
    assert not found, f"evolm.engine.fast must not import evolm.engine.hf: {sorted(found)}"


def test_the_hf_path_imports_no_fast_path(graph: grimp.ImportGraph) -> None:
    found = edges(graph, "evolm.engine.hf", "evolm.engine.fast")
    assert not found, f"evolm.engine.hf must not import evolm.engine.fast: {sorted(found)}"


LEAVES = {
    "evolm.lora": {"evolm.errors", "evolm.files"},
    "evolm.model": {"evolm.errors", "evolm.files"},  # the countdown warm-up data comes from above
    "evolm.sampling": {"evolm.errors"},
    "evolm.preflight.trust": {"evolm.errors"},
    "evolm.metrics": set(),
    "evolm.errors": set(),
    "evolm.files": set(),
    "evolm.interrupt": set(),
    "evolm.dist": set(),
}


@pytest.mark.parametrize(("leaf", "allowed"), sorted(LEAVES.items()))
def test_leaves_import_only_the_basics(
    graph: grimp.ImportGraph, leaf: str, allowed: set[str]
) -> None:
    extra = evolm_imports(graph, leaf) - allowed
    assert not extra, f"{leaf} is a leaf: it may import {sorted(allowed)} of evolm, not {extra}"


def test_only_evaluate_and_its_callers_know_an_engine_and_a_task(
    graph: grimp.ImportGraph,
) -> None:
    """An engine meets a task in evolm.evaluate; the loop, the memory/context checks (limits)
    and the composition root hold both only to pass them on."""
    engine = within(graph, "evolm.engine") | within(graph, "evolm.server")
    task = within(graph, "evolm.task")
    both = {
        m
        for m in within(graph, "evolm")
        if graph.find_modules_directly_imported_by(m) & engine
        and graph.find_modules_directly_imported_by(m) & task
        and not m.startswith(("evolm.engine", "evolm.server", "evolm.task"))
    }
    passers = {"evolm.evaluate", "evolm.loop", "evolm.preflight.limits"} | within(
        graph, "evolm.app"
    )
    assert both <= passers, sorted(both)


CONFIG_READERS = (
    "evolm.app",  # the composition root: the only code that reads the job's config
    "evolm.__main__",
    "evolm.config",  # the schemas and resolvers Hydra composes with
    "evolm.preflight.compose_check",  # the command line, checked before Hydra runs
    "evolm.preflight.trust",  # the _target_s a config may name
    "evolm.cli.rundir",  # a Hydra callback: the run directory
    "evolm.sweep",  # Hydra callbacks and resolvers of sweeps
    "evolm.app.pool",  # asks Hydra whether the job is one of a multirun (engines shared)
)


def test_only_the_composition_root_reads_the_config(graph: grimp.ImportGraph) -> None:
    """The parts a run is built from (es, lora, model, task, engines, servers' clients, loop,
    evaluate, callbacks, tracking, checkpoint) get plain arguments: they import neither
    evolm.config nor a config library; only evolm.app (and __main__) imports evolm.config."""
    readers = set()
    for library in ("omegaconf", "hydra", "hydra_zen", "evolm.config"):
        readers |= graph.find_modules_that_directly_import(library)
    outside = {
        m for m in readers if not any(m == r or m.startswith(r + ".") for r in CONFIG_READERS)
    }
    assert not outside, f"only the composition root reads the config: {sorted(outside)}"
    assert graph.find_modules_that_directly_import("evolm.config") <= {
        "evolm.app.resume",  # a resumed run's config.yaml, checked against the schema
        "evolm.__main__",
    }


def test_nothing_points_up(graph: grimp.ImportGraph) -> None:
    """The composition root is imported by the CLI alone, the loop by the root's run alone,
    evaluate by the loop alone; the engine pool beside the root (one engine per process) by
    the root, the CLI and the sweep's report of it."""
    pool = "evolm.app.pool"
    importers = {
        name: {
            m
            for part in within(graph, name) - {pool}
            for m in graph.find_modules_that_directly_import(part)
        }
        - within(graph, name)
        for name in ("evolm.app", "evolm.loop", "evolm.evaluate", "evolm.sweep")
    }
    assert graph.find_modules_that_directly_import(pool) == {
        "evolm.app.run",
        "evolm.__main__",
        "evolm.sweep.callback",
    }
    assert importers == {
        "evolm.app": {"evolm.__main__"},
        "evolm.loop": {"evolm.app.run"},
        "evolm.evaluate": {"evolm.loop"},
        "evolm.sweep": {"evolm.__main__"},
    }


def importers_of(graph: grimp.ImportGraph, package: str) -> set[str]:
    """The modules outside ``package`` that import it (or a module below it)."""
    found: set[str] = set()
    for module in within(graph, package):
        found |= graph.find_modules_that_directly_import(module)
    return found - within(graph, package)


def test_the_checks_before_a_run_are_the_cli_s_and_the_app_s(graph: grimp.ImportGraph) -> None:
    """``evolm.preflight`` (the command line, trusted targets, memory and context, agreement
    across ranks) runs before a run starts: only the CLI and the composition root import it,
    never a part a run is built from."""
    outside = {m for m in importers_of(graph, "evolm.preflight") if not m.startswith("evolm.app.")}
    assert outside <= {"evolm.__main__"}, sorted(outside)


def test_the_command_line_pieces_are_imported_by_the_command_line(
    graph: grimp.ImportGraph,
) -> None:
    """``evolm.cli`` (the run directory, ``python -m evolm.export``) is imported by
    ``evolm.__main__``, the ``evolm.export`` entry point and the config's ``${evolm.run_dir:}``
    resolver (:func:`evolm.cli.rundir.claim`) alone."""
    assert importers_of(graph, "evolm.cli") <= {"evolm.__main__", "evolm.export", "evolm.config"}


def test_the_tiny_model_is_built_behind_its_spec(graph: grimp.ImportGraph) -> None:
    """Outside ``evolm.model.tiny`` only its spec (``TinyModel``) is imported: the builder, the
    tokenizer, the corpus and the warm-up (torch, tokenizers, transformers) load only to build."""
    inner = within(graph, "evolm.model.tiny") - {"evolm.model.tiny", "evolm.model.tiny.spec"}
    reached = {
        (a, b)
        for b in inner
        for a in graph.find_modules_that_directly_import(b)
        if a not in within(graph, "evolm.model.tiny")
    }
    assert not reached, sorted(reached)


# The top of evolm/: the modules a run passes through and the leaves; everything else lives in a
# folder named for its job (docs/architecture.md). A new module here is a decision: add it.
TOP_LEVEL = {
    "__init__",
    "__main__",  # python -m evolm (must live here)
    "export",  # python -m evolm.export's entry point (the command: evolm.cli.export)
    "config",
    "loop",
    "evaluate",
    "diagnostics",
    "checkpoint",
    "metrics",
    "errors",
    "files",
    "dist",
    "interrupt",
    "sampling",
}


def test_the_top_of_the_package_holds_only_the_core() -> None:
    loose = {p.stem for p in (REPO / "evolm").glob("*.py")}
    assert loose == TOP_LEVEL, (
        f"new: {sorted(loose - TOP_LEVEL)}, gone: {sorted(TOP_LEVEL - loose)}"
    )


def test_optional_hooks_have_no_op_defaults() -> None:
    """Optional hooks live on the protocols with defaults, so an engine or task may skip them."""
    from evolm.engine.base import Engine
    from evolm.task.base import Task

    for cls, hooks in (
        (Engine, ("last_timings", "use_layout", "kl_to_base")),
        (Task, ("after_generation", "summarize", "data_stats", "preflight")),
    ):
        abstract = getattr(cls, "__abstractmethods__", frozenset())
        for hook in hooks:
            assert hasattr(cls, hook) and hook not in abstract, f"{cls.__name__}.{hook}"


def test_the_product_never_imports_the_test_stand_ins(graph: grimp.ImportGraph) -> None:
    """evolm.testing (the SGLang stand-in) is started as a process by tests, never imported."""
    importers = set()
    for module in within(graph, "evolm.testing"):
        importers |= graph.find_modules_that_directly_import(module)
    assert importers <= within(graph, "evolm.testing"), sorted(importers)


def test_only_the_kernels_import_triton(graph: grimp.ImportGraph) -> None:
    importers = graph.find_modules_that_directly_import("triton")
    outside = {m for m in importers if not m.startswith("evolm.engine.kernels.")}
    assert not outside, f"only evolm.engine.kernels may import triton: {sorted(outside)}"


def test_composing_the_default_config_imports_only_what_it_uses() -> None:
    """Schemas are generated lazily: the default run (server=local, task=conciseness) imports
    no server client, no other task and no transformers when its config is composed."""
    code = (
        "import sys; from tests.helpers import compose_config; compose_config();"
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    loaded = set(out)
    assert "evolm.engine.local" in loaded and "evolm.task.conciseness" in loaded
    unused = {"evolm.server.sglang", "evolm.server.vllm", "evolm.task.countdown"}
    assert not loaded & unused, sorted(loaded & unused)
    assert "transformers" not in loaded and "mlflow" not in loaded


# What ES moves (es.mean) is asked in one place: the strategy factory (evolm.app.modes), beside
# the strategy classes themselves (evolm.es) and the config checks (evolm.app.checks).
WHO_MAY_ASK_THE_MODE = ("evolm.es", "evolm.app.modes", "evolm.app.checks")


def mode_questions(tree: ast.AST) -> list[int]:
    """Lines that ask which update rule is in use: ``x.mean == "full"`` (or ``!=``, "lora"),
    ``x.get("mean", ...)``, ``isinstance(x, FullES)``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(isinstance(x, ast.Attribute) and x.attr == "mean" for x in sides)
            mode = any(isinstance(x, ast.Constant) and x.value in ("full", "lora") for x in sides)
            if named and mode:
                lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            f = node.func
            asks_get = (
                isinstance(f, ast.Attribute)
                and f.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "mean"
            )
            asks_type = (
                isinstance(f, ast.Name)
                and f.id == "isinstance"
                and len(node.args) == 2
                and "FullES" in ast.unparse(node.args[1])
            )
            if asks_get or asks_type:
                lines.append(node.lineno)
    return sorted(lines)


def test_only_the_strategy_factory_asks_what_es_moves() -> None:
    """No code outside the strategy classes, the strategy factory and the config checks asks
    whether the run is ``es.mean=full`` or ``lora``: the loop and the run call the strategy's
    protocol and the run's :class:`evolm.app.modes.Mode`."""
    found = {}
    for path in sorted((REPO / "evolm").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if any(module == m or module.startswith(m + ".") for m in WHO_MAY_ASK_THE_MODE):
            continue
        lines = mode_questions(ast.parse(path.read_text()))
        if lines:
            found[module] = lines
    assert not found, f"these ask which update rule is in use (module: lines): {found}"


def test_the_mode_question_is_seen_where_it_is_asked() -> None:
    """The check above finds each form it looks for (it could not pass by finding nothing)."""
    code = (
        'if es.mean == "full": pass\n'
        'if cfg.es.get("mean", "lora") != "full": pass\n'
        "if isinstance(s, FullES): pass\n"
        "if es.population_size == 2: pass\n"
    )
    assert mode_questions(ast.parse(code)) == [1, 2, 3]


def test_nothing_above_the_engine_reaches_into_the_fast_path(graph: grimp.ImportGraph) -> None:
    """The scheduler, runner and workspaces of ``evolm.engine.fast`` are the local engine's:
    nothing outside ``evolm.engine`` imports them (the SGLang stand-in, a test double, reads
    the fast path's merged weights to serve exactly what the local engine serves)."""
    outside = {
        a
        for a, _ in edges(graph, "evolm", "evolm.engine.fast")
        if not a.startswith(("evolm.engine", "evolm.testing"))
    }
    assert not outside, sorted(outside)

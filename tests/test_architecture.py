"""The package's import rules (docs/architecture.md), checked on the real import graph.

grimp builds the graph from the source (module-level, function-level and TYPE_CHECKING imports
alike), so a rule broken anywhere in a module fails here, in CI.
"""

from __future__ import annotations

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


def test_es_core_imports_only_torch_and_errors(graph: grimp.ImportGraph) -> None:
    """The ES core is pure torch: no I/O libraries, nothing else of evolm."""
    allowed = {"torch", "evolm.errors"}
    extra = {m for m in imported_by(graph, "evolm.es") if m not in allowed and m not in STDLIB}
    assert not extra, f"evolm.es imports {sorted(extra)}"


@pytest.mark.parametrize(
    ("source", "forbidden"),
    [
        ("evolm.engine", "evolm.task"),  # engines know sampling settings, never a task
        ("evolm.server", "evolm.task"),
        ("evolm.task", "evolm.server"),  # tasks are leaves: no engine, no server
        ("evolm.task", "evolm.engine"),
        ("evolm.lora", "evolm.engine"),
        ("evolm.model", "evolm.engine"),
        ("evolm.engine.fast", "evolm.engine.hf"),  # the fast path samples with engine.sampler
    ],
)
def test_forbidden_edges(graph: grimp.ImportGraph, source: str, forbidden: str) -> None:
    edges = {
        (a, b)
        for a in within(graph, source)
        for b in graph.find_modules_directly_imported_by(a)
        if b in within(graph, forbidden)
    }
    assert not edges, f"{source} must not import {forbidden}: {sorted(edges)}"


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

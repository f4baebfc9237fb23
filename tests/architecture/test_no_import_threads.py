"""No background thread that imports: a scheduled run once deadlocked for good when a thread
importing Great Expectations held the GIL inside ``dlopen`` while the main thread, inside
``dl_iterate_phdr`` (threadpoolctl), waited for the GIL.

Every place production code starts a thread is listed here with what the thread does; a new one
fails this test until it is reviewed and listed (its target must import nothing: modules it needs
are imported before it starts).  The listed threads compute, hash, read sockets or files, or
watch the clock; none imports a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mechanisms", "catalog", "tasks", "flows")
THREAD_FACTORIES = {"Thread", "ThreadPoolExecutor", "start_new_thread", "Timer"}

REVIEWED = {
    ("catalog/confidential/source.py", 1): "hashes the input files while Arrow reads them",
    ("catalog/confidential/dask_count.py", 1): "hashes the input files while the cluster counts",
    (
        "mechanisms/primitives/compute_limits.py",
        1,
    ): "runs one LAPACK call so the caller can be interrupted",
    ("mechanisms/primitives/noise.py", 1): "OpenDP noise shards (the sampler is imported before)",
    ("flows/interrupt.py", 2): (
        "the Ctrl-C wake-up fd reader, and its clean-up threads (the abort recorded at the first "
        "Ctrl-C, the bounded clean-up before a hard exit)"
    ),
    ("flows/server.py", 1): "touches the server's last-used file while a command runs",
    ("flows/watchdog.py", 2): "the stage monitor, and its bounded clean-up before a hard exit",
}


def _thread_starts(path: Path) -> int:
    tree = ast.parse(path.read_text(), filename=str(path))
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            count += name in THREAD_FACTORIES
    return count


def test_every_thread_production_code_starts_is_reviewed() -> None:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            count = _thread_starts(path)
            if count:
                found[(path.relative_to(ROOT).as_posix(), count)] = True
    assert set(found) == set(REVIEWED), (
        "threads started outside the reviewed list (or a listed one removed): "
        f"{sorted(set(found) ^ set(REVIEWED))}"
    )


def test_great_expectations_is_never_imported_on_a_background_thread() -> None:
    """The thread that caused the deadlock is gone: GX is imported only where it is used."""
    source = (ROOT / "catalog" / "validation" / "gx.py").read_text()
    assert "prewarm" not in source and "threading" not in source
    flow = (ROOT / "flows" / "release_flow.py").read_text()
    assert "prewarm" not in flow

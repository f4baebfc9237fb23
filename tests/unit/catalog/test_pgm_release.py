"""``reconstruct: pgm`` through the release stages (no Prefect), and ``dprelease synth`` from the
published release: consistent non-negative tables, the estimator recorded, synthetic rows in the
domain, nothing charged, refusals that name the rule."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release
from dprelease.catalog.errors import CatalogError, SpecError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.publishing.synthetic import synthesize, synthetic_records
from dprelease.catalog.review import decisions as review
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.workload import axes_of, item_subset
from tests.samplers import SeededNumpyNoise
from tests.stages import release_stages

DOMAIN = {
    "a": {"min": 0, "max": 3},
    "b": {"values": ["x", "y", "z"]},
    "c": {"bins": [0.0, 10.0, 20.0, 30.0]},
    "d": {"min": 10, "max": 19},
}


@dataclass(frozen=True)
class Released:
    spec: ReleaseSpec
    catalog: Catalog
    release_id: str
    directory: Path
    tables: dict[str, pa.Table]


def _release(root: Path, rng: np.random.Generator, *, reconstruct: str, approve: bool) -> Released:
    size = 2000
    source = root / "people.parquet"
    if not source.exists():  # dependent attributes with many empty cells (d = 10 + 2a + 0|1)
        a = rng.integers(0, 4, size)
        b = rng.choice(["x", "y", "z"], size, p=[0.7, 0.2, 0.1])
        c = np.where(b == "x", rng.uniform(0, 10, size), rng.uniform(0, 30, size))
        d = 10 + 2 * a + rng.integers(0, 2, size)
        pq.write_table(pa.table({"a": a, "b": b, "c": c, "d": d}), source)
    spec = parse_spec(
        {
            "name": f"pgm-{reconstruct.replace('_', '-')}",
            "dataset": {"id": "pgm-ds", "source": str(source), "budget": {"epsilon": 10.0}},
            "domain": DOMAIN,
            "workload": [{"name": "pairs", "marginals": {"attributes": "all", "degree": 2}}],
            "mechanism": "marginal_space",
            "reconstruct": reconstruct,
            "privacy": {"epsilon": 0.5},
        }
    )
    catalog = Catalog(f"sqlite:///{root / 'catalog.db'}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(noise, "production_sampler", lambda: SeededNumpyNoise(rng))
        directory = release_stages(spec, catalog, root / "out")
    release_id = directory.name
    tables = {path.stem: pq.read_table(path) for path in (directory / "tables").glob("*.parquet")}
    if approve:
        review.review(
            catalog,
            release_id,
            approve=True,
            reviewer="tester",
            note="ok",
            publish_dir=root / "published",
        )
    return Released(spec, catalog, release_id, directory, tables)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Released:
    rng = np.random.default_rng(515)  # public randomness: test data and test-only noise
    return _release(tmp_path_factory.mktemp("pgm"), rng, reconstruct="pgm", approve=True)


def _one_way(spec: ReleaseSpec, tables: dict[str, pa.Table]) -> dict[int, list[np.ndarray]]:
    """Every 1-way marginal implied by every released table."""
    workload = make_plan(spec).workload
    shape = spec.domain_shape
    seen: dict[int, list[np.ndarray]] = {}
    for item in workload.items:
        axes = axes_of(item_subset(item), len(shape))
        table = tables[item.name]["estimate"].to_numpy().reshape([shape[a] for a in axes])
        for k, axis in enumerate(axes):
            other = tuple(j for j in range(len(axes)) if j != k)
            seen.setdefault(axis, []).append(table.sum(axis=other))
    return seen


def test_pgm_tables_are_nonnegative_consistent_and_labelled(published: Released) -> None:
    tables = published.tables
    assert len(tables) == 6
    for table in tables.values():
        assert table["estimate"].to_numpy().min() >= 0.0
        assert set(table["uncertainty"].to_pylist()) == {"noise-only"}
        assert table["ci_low"].null_count == table.num_rows  # no interval is claimed
    for axis, margins in _one_way(published.spec, tables).items():
        assert len(margins) == 3, axis
        for other in margins[1:]:
            np.testing.assert_allclose(other, margins[0], rtol=0, atol=1e-6)
    manifest = release.artifacts.read_manifest(published.directory)
    details = manifest["mechanism"]["details"]
    assert details["estimator"] == "pgm"
    assert set(details["tables_by_estimator"]["pgm"]) == set(tables)
    assert "empirical" in details["estimator_note"]
    report = (published.directory / "report.html").read_text()
    assert "estimator note" in report and "Its error is empirical" in report


def test_synth_samples_the_domain_without_charging(published: Released, tmp_path: Path) -> None:
    catalog = published.catalog
    spent = catalog.spent("pgm-ds")
    entries = len(catalog.ledger_entries("pgm-ds"))
    out = tmp_path / "synthetic.parquet"
    record = synthesize(published.release_id, rows=5000, out=out, catalog=catalog, seed=7)
    assert catalog.spent("pgm-ds") == spent  # post-processing: nothing charged
    assert len(catalog.ledger_entries("pgm-ds")) == entries
    table = pq.read_table(out)
    assert table.column_names == list(DOMAIN)
    assert table.num_rows == 5000
    for name, attribute in published.spec.domain.items():
        _, valid = attribute.encode(np.asarray(table[name].to_pylist(), dtype=object))
        assert valid.all(), name
    assert synthetic_records(catalog, published.release_id) == [record]
    assert record.sha256 == release.artifacts.sha256_file(out)
    again = synthesize(
        published.release_id, rows=5000, out=tmp_path / "again.parquet", catalog=catalog, seed=7
    )
    assert again.sha256 == record.sha256  # the recorded seed reproduces the file


def test_synth_follows_the_released_tables(published: Released, tmp_path: Path) -> None:
    """The tree model keeps every 1-way table: the synthetic frequencies match the released
    1-way marginals (chi-square, false-failure rate 1e-6), and a shifted table is rejected."""
    from scipy.stats import chisquare

    rows = 20000
    out = tmp_path / "s.parquet"
    synthesize(published.release_id, rows=rows, out=out, catalog=published.catalog, seed=11)
    data = pq.read_table(out)
    margins = _one_way(published.spec, published.tables)
    for axis, (name, attribute) in enumerate(published.spec.domain.items()):
        index, _ = attribute.encode(np.asarray(data[name].to_pylist(), dtype=object))
        observed = np.bincount(index, minlength=attribute.size)
        expected = margins[axis][0] / margins[axis][0].sum() * rows
        keep = expected > 0
        assert observed[~keep].sum() == 0
        assert chisquare(observed[keep], expected[keep]).pvalue > 1e-6, name
        wrong = np.roll(expected[keep], 1)
        if not np.allclose(wrong, expected[keep], rtol=0.2):
            assert chisquare(observed[keep], wrong).pvalue < 1e-6, name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rows": 0}, "--rows (0) must be between 1"),
        ({"exists": True}, "exists; choose a new file"),
    ],
)
def test_synth_refuses_bad_arguments(
    published: Released, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    out = tmp_path / "o.parquet"
    if change.get("exists"):
        out.write_bytes(b"")
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        synthesize(
            published.release_id, rows=change.get("rows", 10), out=out, catalog=published.catalog
        )


def test_synth_refuses_unpublished_and_least_squares_releases(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)  # public randomness: test data and test-only noise
    staged = _release(tmp_path, rng, reconstruct="pgm", approve=False)
    with pytest.raises(CatalogError, match="is staged; synth samples from a published release"):
        synthesize(staged.release_id, rows=10, out=tmp_path / "a.parquet", catalog=staged.catalog)
    plain = _release(tmp_path, rng, reconstruct="least_squares", approve=True)
    with pytest.raises(SpecError, match=r"reconstructed with 'least_squares'.*reconstruct: pgm"):
        synthesize(plain.release_id, rows=10, out=tmp_path / "b.parquet", catalog=plain.catalog)
    assert not (tmp_path / "b.parquet").exists()
    lowest = min(
        float(t["estimate"].to_numpy().min()) for t in plain.tables.values()
    )  # least squares at ε = 0.5 on small counts goes negative: pgm has work to do
    assert lowest < 0


def test_pgm_is_refused_before_any_charge_for_a_plan_without_marginals(tmp_path: Path) -> None:
    spec = parse_spec(
        {
            "name": "cdf",
            "dataset": {
                "id": "cdf-ds",
                "source": str(tmp_path / "x.parquet"),
                "budget": {"epsilon": 1.0},
            },
            "domain": {"a": {"min": 0, "max": 7}},
            "workload": [{"name": "cdf", "prefix": "a"}],
            "mechanism": "hierarchical",
            "reconstruct": "pgm",
            "privacy": {"epsilon": 0.5},
        }
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    plan = make_plan(spec)
    with pytest.raises(SpecError, match="reconstruct: pgm needs a marginal-space plan"):
        release.register(spec, plan, catalog, release_id="r1")
    assert catalog.ledger_entries() == []
    auto = spec.model_copy(update={"reconstruct": "auto"})
    assert release.estimators.estimator(auto, plan) == "least_squares"


def test_the_synth_command_writes_and_reports(
    published: Released, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from dprelease.flows.cli import app

    monkeypatch.setenv("DPRELEASE_CATALOG_URL", published.catalog.url)
    out = tmp_path / "cli.parquet"
    args = ["synth", published.release_id, "--rows", "50", "--out", str(out), "--seed", "5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "wrote 50 synthetic rows" in result.output and "no budget charged" in result.output
    assert pq.read_table(out).num_rows == 50
    again = CliRunner().invoke(app, args)  # the file exists: refused, named, non-zero exit
    assert again.exit_code != 0
    assert "exists; choose a new file" in again.output


def test_pgm_too_large_for_one_machine_is_refused_and_auto_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dprelease.catalog.planning import estimators

    spec = parse_spec(
        {
            "name": "big",
            "dataset": {"id": "big-ds", "budget": {"epsilon": 1.0}},
            "domain": DOMAIN,
            "workload": [{"name": "pairs", "marginals": {"attributes": "all", "degree": 2}}],
            "mechanism": "marginal_space",
            "reconstruct": "pgm",
            "privacy": {"epsilon": 0.5},
        }
    )
    plan = make_plan(spec)
    size = estimators.pgm_size(spec, plan)
    assert size == 4 * (4 * 3 + 4 * 3 + 4 * 10 + 3 * 3 + 3 * 10 + 3 * 10)  # cells × 2² per pair
    assert estimators.estimator(spec, plan) == "pgm"
    monkeypatch.setattr(estimators, "MAX_PGM_NONZEROS", size - 1)
    with pytest.raises(SpecError, match=f"over {size:,} table entries"):
        estimators.estimator(spec, plan)
    auto = spec.model_copy(update={"reconstruct": "auto"})
    assert estimators.estimator(auto, plan) == "least_squares"


def test_an_unknown_estimator_is_refused_by_name() -> None:
    raw = {
        "name": "x",
        "dataset": {"id": "d", "budget": {"epsilon": 1.0}},
        "domain": DOMAIN,
        "workload": [{"name": "t", "total": True}],
        "privacy": {"epsilon": 1.0},
        "reconstruct": "nnls",
    }
    with pytest.raises(SpecError, match=r"reconstruct: Input should be 'least_squares', 'pgm'"):
        parse_spec(raw)

"""The execution setting (``catalog.engine``): every validator fires with the field and the rule,
the CLI overrides the spec, and ``open_cluster`` starts, joins and closes clusters as documented."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from dprelease.catalog import engine
from dprelease.catalog.engine import (
    LOCAL,
    ClusterUnreachableError,
    Execution,
    open_cluster,
    resolve_execution,
    with_execution,
)
from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.load import parse_spec


def _spec(**top: Any):
    return parse_spec(
        {
            "name": "t",
            "dataset": {"id": "ds", "budget": {"epsilon": 1.0}},
            "domain": {"a": {"min": 0, "max": 3}},
            "workload": [{"name": "all", "marginal": ["a"]}],
            "privacy": {"epsilon": 1.0},
            **top,
        }
    )


def test_default_is_local_without_address() -> None:
    assert Execution() == LOCAL
    assert (LOCAL.engine, LOCAL.address) == ("local", None)
    assert _spec().execution == LOCAL


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"engine": "spark"}, r"engine\n.*Input should be 'local' or 'dask'"),
        ({"engine": "dask", "address": "localhost:8786"}, r"execution.address.*tcp://host:port"),
        ({"engine": "dask", "address": "http://h:8786"}, r"execution.address.*tcp://host:port"),
        (
            {"engine": "dask", "address": "tcp://h:99999"},
            r"execution.address.*port must be 1..65535",
        ),
        ({"engine": "dask", "address": "tcp://h:0"}, r"execution.address.*port must be 1..65535"),
        ({"engine": "local", "address": "tcp://h:8786"}, r"needs execution.engine: dask"),
        ({"engine": "dask", "workers": 3}, r"workers\n.*Extra inputs are not permitted"),
        ({"engine": "dask", "address": 8786}, r"address\n.*Input should be a valid string"),
    ],
)
def test_validators_name_field_and_rule(fields: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValidationError, match=pattern):
        Execution(**fields)


def test_spec_refuses_a_bad_execution_with_the_field() -> None:
    with pytest.raises(SpecError, match=r"execution.*needs execution.engine: dask"):
        _spec(execution={"engine": "local", "address": "tcp://127.0.0.1:8786"})
    assert _spec(execution={"engine": "dask", "address": "tls://10.0.0.1:8786"}).execution == (
        Execution(engine="dask", address="tls://10.0.0.1:8786")
    )


def test_frozen() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        LOCAL.engine = "dask"  # type: ignore[misc]


def test_cli_wins_over_the_spec() -> None:
    spec_setting = Execution(engine="dask", address="tcp://10.0.0.1:8786")
    assert resolve_execution(spec_setting) == spec_setting
    assert resolve_execution(spec_setting, engine="local") == LOCAL
    assert resolve_execution(LOCAL, engine="dask") == Execution(engine="dask")
    assert resolve_execution(LOCAL, address="tcp://h:1") == Execution(
        engine="dask", address="tcp://h:1"
    )
    assert resolve_execution(spec_setting, address="tcp://h:2").address == "tcp://h:2"
    assert resolve_execution(spec_setting, engine="dask").address == "tcp://10.0.0.1:8786"


@pytest.mark.parametrize(
    ("engine_name", "address", "pattern"),
    [
        ("spark", None, r"--engine/--address: execution.engine: Input should be 'local' or 'dask'"),
        ("local", "tcp://h:1", r"--engine/--address: .*needs execution.engine: dask"),
        (None, "h:1", r"--engine/--address: execution.address: .*tcp://host:port"),
    ],
)
def test_cli_values_are_refused_as_spec_errors(
    engine_name: str | None, address: str | None, pattern: str
) -> None:
    with pytest.raises(SpecError, match=pattern):
        resolve_execution(None, engine=engine_name, address=address)


def test_with_execution_replaces_only_when_overridden() -> None:
    spec = _spec()
    assert with_execution(spec, engine=None, address=None) is spec
    changed = with_execution(spec, engine="dask", address=None)
    assert changed.execution == Execution(engine="dask")
    assert changed.fingerprint() == spec.fingerprint()  # where it runs changes no output


def test_local_opens_nothing_and_never_imports_dask() -> None:
    with open_cluster(LOCAL) as client:
        assert client is None
    probe = (
        "import sys\n"
        "from dprelease.catalog.engine import LOCAL, open_cluster\n"
        "import dprelease.catalog.spec.load, dprelease.catalog.confidential.inputs, dprelease.catalog.confidential.dask_count\n"
        "with open_cluster(LOCAL) as client:\n"
        "    assert client is None\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_joining_a_cluster_leaves_it_running(dask_address: str) -> None:
    from distributed import Client

    with open_cluster(Execution(engine="dask", address=dask_address)) as client:
        assert client is not None
        assert client.submit(sum, [1, 2]).result(timeout=60) == 3
        assert len(client.scheduler_info()["workers"]) == 2
    assert client.status == "closed"
    with Client(dask_address, timeout=30, set_as_default=False) as again:  # still up
        assert len(again.scheduler_info()["workers"]) == 2


def test_an_unreachable_address_fails_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.dask_cluster import free_port

    monkeypatch.setattr(engine, "CONNECT_TIMEOUT_S", 2)
    address = f"tcp://127.0.0.1:{free_port()}"
    with (
        pytest.raises(ClusterUnreachableError, match=r"execution.address.*no Dask scheduler"),
        open_cluster(Execution(engine="dask", address=address)),
    ):
        pass


def test_without_address_a_local_cluster_is_started_and_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine, "local_cluster_size", lambda: (1, 1 << 30))
    with (  # closed also when the body raises
        pytest.raises(RuntimeError, match="body failed"),
        open_cluster(Execution(engine="dask")) as client,
    ):
        assert client is not None
        cluster = client.cluster
        assert len(client.scheduler_info()["workers"]) == 1
        raise RuntimeError("body failed")
    assert client.status == "closed"
    assert cluster.status.name == "closed"


def test_local_cluster_is_sized_to_the_machine() -> None:
    import os

    import psutil

    workers, memory = engine.local_cluster_size()
    assert workers == os.cpu_count()
    assert workers * memory <= psutil.virtual_memory().total


def test_two_runs_at_once_each_start_their_own_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fixed port (scheduler or HTTP): a second LocalCluster neither clashes nor warns."""
    monkeypatch.setattr(engine, "local_cluster_size", lambda: (1, 1 << 30))
    with (
        open_cluster(Execution(engine="dask")) as first,
        open_cluster(Execution(engine="dask")) as second,
    ):
        assert first is not None and second is not None
        assert first.scheduler.address != second.scheduler.address
        assert first.submit(sum, [1, 2]).result(timeout=60) == 3
        assert second.submit(sum, [3, 4]).result(timeout=60) == 7

"""Strategy-store keys and stored parameters keep the tokens written before the noise kind was the
one name (``{"norm": 1|2}``, eigen's ``{"norm": "l1"|"l2"}``), so existing entries still load."""

from __future__ import annotations

import dataclasses

import pytest

from dprelease.catalog.planning import planner as planning
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms import eigen, marginal_space, optimized
from dprelease.mechanisms.primitives.privacy import PrivacyCost

# Computed with the code before the rename (fingerprint "0123456789abcdef" * 4).
KEYS = {
    ("pure", "optimized"): "01fd505eec9ff0fc163f4fd1d9a2c2b2d6816c3c8b7261d68513c94f6476a299",
    ("pure", "marginal_space"): "4c3f03f90a03b5a25c655f2dc4846e76168a46d82c3145c9e29d1617d8cec171",
    ("pure", "eigen"): "d106c526fc316e18213b387d2aa6dcad6850bbf5fbe704b5ef7fe3211dd89d8f",
    ("zcdp", "optimized"): "f9a0651a4803c836545d16e79fdd95fba62226c869cb02e6e2c38e2be03d6ba4",
    ("zcdp", "marginal_space"): "d5000dd01776b457d44093c7a553f30dc8e13ad58b8bf7da1621c7e189453b1a",
    ("zcdp", "eigen"): "19116b19d4ebaae7daf50fe326b7d7674110dffbeb7a28a22607b0eb8e26d41f",
}
TARGETS = {
    "pure": PrivacyCost(measure="pure", epsilon=1.0),
    "zcdp": PrivacyCost(measure="zcdp", rho=0.5),
}


class _Looked(Exception):
    pass


class _KeyCache:
    """Stops a plan at its first store lookup and reports the key."""

    def load(self, key: str) -> None:
        raise _Looked(key)

    def save(self, key: str, stored: object) -> None:
        raise AssertionError("a plan saved before it looked up")


@pytest.mark.parametrize(("measure", "mechanism"), sorted(KEYS))
def test_store_keys_are_unchanged(measure: str, mechanism: str) -> None:
    spec = parse_spec(
        {
            "name": "r",
            "dataset": {"id": "r", "budget": {"rho": 5}},
            "domain": {n: {"min": 0, "max": 2} for n in "abc"},
            "workload": [{"name": "ab", "marginal": ["a", "b"]}, {"name": "c", "marginal": ["c"]}],
            "privacy": {"rho": 0.5},
        }
    )
    request = dataclasses.replace(
        planning.plan_request(spec, workload=planning.build_workload(spec), requested=True),
        target=TARGETS[measure],
        workload_fingerprint="0123456789abcdef" * 4,
    )
    module = {"optimized": optimized, "marginal_space": marginal_space, "eigen": eigen}[mechanism]
    with pytest.raises(_Looked) as looked:
        module.MECHANISM.plan(request, cache=_KeyCache())
    assert looked.value.args[0] == KEYS[measure, mechanism]

"""One policy registry for the simulator, the pipeline and the vLLM plugin: built-in names,
variants, run-time registrations and out-of-tree import paths, with errors that name the
policy."""

from __future__ import annotations

import pytest

from accelgen.core.policy import Decision, Policy, SchedulerView
from accelgen.policies import registry
from accelgen.policies.registry import make_policy, policy_names, register_policy


class _Nothing(Policy):
    name = "nothing"

    def schedule(self, view: SchedulerView) -> Decision:
        return Decision()


class NotAPolicy:
    pass


def test_builtins_and_variants() -> None:
    p = make_policy("accelgen/order", {"gamma": 0.5})
    assert p.name == "accelgen" and p.params.order is False and p.params.gamma == 0.5  # type: ignore[attr-defined]
    assert {"accelgen", "accelgen/order", "oracle", "vllm"} <= set(policy_names())
    with pytest.raises(ValueError, match="unknown policy 'fastgn'"):
        make_policy("fastgn")
    with pytest.raises(ValueError, match="bad parameters for policy 'vllm'"):
        make_policy("vllm", {"no_such_key": 1})


def test_registered_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTERED", {})
    register_policy("nothing", _Nothing)
    assert "nothing" in policy_names()
    assert isinstance(make_policy("nothing"), _Nothing)
    with pytest.raises(ValueError, match="built in"):
        register_policy("vllm", _Nothing)


@pytest.mark.parametrize("path", [f"{__name__}:_Nothing", f"{__name__}._Nothing"])
def test_import_paths(path: str) -> None:
    assert isinstance(make_policy(path), _Nothing)


@pytest.mark.parametrize("path, message", [
    ("no_such_module_xyz:Policy", "cannot import no_such_module_xyz"),
    (f"{__name__}:Missing", "has no 'Missing'"),
    (f"{__name__}:NotAPolicy", "not an accelgen.core.policy.Policy subclass"),
])
def test_bad_import_paths_name_the_policy(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy(path)

"""The run spec: built once from the validated scenario, handed to every party as it is."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from raymvc import scenario as scenario_mod
from raymvc.driver import prepare
from raymvc.runtime.nodes import ClientNode, ServerNode
from raymvc.runtime.spec import RunSpec
from raymvc.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def _spec(overrides=None):
    sc = load_scenario(ROOT / "scenarios" / "digits-kfed.yaml", overrides=overrides or {})
    ds, part = prepare(sc)
    return sc, part, RunSpec.build(sc, part, ds)


def test_the_spec_holds_the_scenarios_validated_configs_and_is_frozen():
    sc, part, spec = _spec({"faults.dropout.rate": 0.25, "faults.partial_work": {"fraction": 0.5, "work": 0.5},
                            "channel.encryption": "aes-gcm"})
    assert isinstance(spec.faults, scenario_mod.FaultsCfg) and spec.faults.dropout.rate == 0.25
    assert isinstance(spec.channel, scenario_mod.ChannelCfg) and spec.channel.encryption == "aes-gcm"
    assert spec.partial_work == sc.faults.partial_work
    assert spec.client_ids == list(range(part.n_clients)) and spec.method == sc.method
    assert spec.client_sizes == {c: part.shards[c].rows_held for c in spec.client_ids}
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1
    back = pickle.loads(pickle.dumps(spec))  # what an actor receives
    assert back == spec and isinstance(back.network, scenario_mod.NetworkCfg)


def test_the_spec_is_read_only_all_the_way_down():
    """No party can change what another party in the same process reads: the sections are
    frozen models, the mappings read-only (lists inside them tuples), also after pickling."""
    from pydantic import ValidationError

    from raymvc.runtime.spec import FrozenMap

    sc, _, spec = _spec({"faults.dropout.rate": 0.25, "params.k_local": 12,
                         "faults.drop": [{"client": 1, "at_round": 0}]})
    for s in (spec, pickle.loads(pickle.dumps(spec))):
        with pytest.raises(ValidationError, match="frozen"):
            s.faults.dropout.rate = 0.5
        with pytest.raises(ValidationError, match="frozen"):
            s.channel.encryption = "none"
        with pytest.raises((TypeError, AttributeError)):
            s.faults.drop.append(None)  # a section's lists are tuples
        for mapping in (s.params, s.client_sizes, s.client_dims):
            assert isinstance(mapping, FrozenMap)
            with pytest.raises(TypeError):
                mapping[0] = 1
        assert s.params["k_local"] == 12 and s.faults.dropout.rate == 0.25
    with pytest.raises(ValidationError, match="frozen"):
        sc.faults.dropout.rate = 0.5  # the scenario itself is frozen too
    cfg = spec.method_config(__import__("raymvc.protocols.kfed", fromlist=["PROTOCOL"]).PROTOCOL)
    assert cfg.k_local == 12  # each party's own copy of the Config, opened from the sealed values


def test_parties_build_from_the_spec_without_validating_a_config_again(monkeypatch):
    """The configs crossed as typed objects: no party rebuilds one from a dict."""
    sc, part, spec = _spec({"faults.dropout.rate": 0.25})
    for name in ("ChannelCfg", "FaultsCfg", "NetworkCfg", "PartialWorkCfg", "DevicesCfg", "DeviceClass"):
        cls = getattr(scenario_mod, name)

        def refuse(self, *a, _name=name, **k):
            raise AssertionError(f"{_name} validated again inside a party")

        monkeypatch.setattr(cls, "__init__", refuse)
    clients = {c: ClientNode(c, spec, part.shards[c]) for c in spec.client_ids}
    server = ServerNode(spec, clients)
    server.connect()
    server.begin()
    assert server.plan.cfg is spec.faults and server.exchange is not None


def test_the_methods_params_are_validated_once_in_the_driver_and_reach_every_party_typed(monkeypatch):
    """Loading the scenario validates ``params``; the spec seals that very Config and each
    party opens its own copy: one validation a run, not one per party (n + 2 before)."""
    from raymvc.protocols import get

    cls = get("kfed").config
    calls = []
    original = cls.__init__

    def counting(self, *a, **k):
        calls.append(k)
        original(self, *a, **k)

    monkeypatch.setattr(cls, "__init__", counting)
    sc, part, spec = _spec({"params.kmeans_init": 3})
    clients = {c: ClientNode(c, spec, part.shards[c]) for c in spec.client_ids}
    server = ServerNode(spec, clients)
    assert len(calls) == 1  # loading the scenario; the spec and the parties reused it
    back = pickle.loads(pickle.dumps(spec))  # an actor's spec: the config crosses sealed
    assert back.config == spec.config and back.method_config(get("kfed")).kmeans_init == 3
    opened = [spec.method_config(get("kfed")) for _ in range(2)]
    assert opened[0] == opened[1] and opened[0] is not opened[1]  # each party its own copy
    assert len(calls) == 1 and server.server is not None

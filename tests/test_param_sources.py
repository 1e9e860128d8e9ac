"""Every parameter of every registered method says where its default comes from: the paper
(and where in it), not stated there (and why ours), a departure from what the paper states,
or a project option; ``raymvc params`` shows it."""

from __future__ import annotations

import json

import pytest
from pydantic import Field

from raymvc.cli import main, param_rows
from raymvc.protocol import (
    ProtocolConfig,
    departure,
    not_stated,
    paper,
    project_option,
    remark,
    source_problems,
    source_text,
)
from raymvc.protocols import available, get


@pytest.mark.parametrize("method", available())
def test_every_parameter_of_every_method_is_marked(method):
    config = get(method).config
    assert config.model_fields, f"{method}: a Config without fields"
    assert source_problems(config) == [], f"{method}: " + "; ".join(source_problems(config))


class _Marked(ProtocolConfig):
    rate: float = Field(default=0.1, description="a weight", **paper("Sec. 4.3", value=0.1))
    width: tuple[int, ...] = Field(default=(8, 8), description="widths",
                                   **not_stated("two layers of 8, enough for toy data"))
    epochs: int = Field(default=5, description="epochs", **departure("Table 2: 500 epochs", "5, for two CPU cores",
                                                                     paper_value=500))
    fast: bool = Field(default=False, description="a switch", **project_option())


class _Child(_Marked):
    rate: float = remark(_Marked, "rate", not_stated("the child's paper leaves it open, so ours"))


def test_marks_read_as_one_line_each_and_a_subclass_can_remark_an_inherited_field():
    texts = {name: source_text(f) for name, f in _Marked.model_fields.items()}
    assert texts == {"rate": "paper: Sec. 4.3", "width": "not stated; ours: two layers of 8, enough for toy data",
                     "epochs": "departure; paper: Table 2: 500 epochs; ours: 5, for two CPU cores",
                     "fast": "project option"}
    assert source_problems(_Marked) == [] and source_problems(_Child) == []
    child = _Child.model_fields["rate"]
    assert source_text(child).startswith("not stated;") and child.default == 0.1 and child.description == "a weight"
    assert _Child(rate=0.5).rate == 0.5


@pytest.mark.parametrize("field, words", [
    (Field(default=1), "rate: unmarked"),
    (Field(default=1, json_schema_extra={"source": {"kind": "folklore"}}), "unknown kind 'folklore'"),
    (Field(default=1, **paper("somewhere")), "names no place in the paper"),
    (Field(default=1, **not_stated("why")), "gives no reason"),
    (Field(default=1, **paper("Eq. 3", value=2)), "default 1 is not the paper's 2"),
    (Field(default=2, **departure("Eq. 3: 2", "ours is the same", paper_value=2)), "a departure whose default 2"),
])
def test_an_unmarked_or_malformed_field_is_named(field, words):
    class Bad(ProtocolConfig):
        rate: int = field

    problems = source_problems(Bad)
    assert len(problems) == 1 and words in problems[0], problems


def test_params_shows_the_source_column_and_its_json(capsys):
    assert main(["params", "efimvc"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.strip().startswith("param"))
    assert head.index("range") < head.index("source") < head.index("description")
    assert "paper: Alg. 1" in out and "not stated; ours:" in out and "departure; paper: Sec. 3.4.1" in out
    assert main(["params", "efimvc", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["max_rounds"]["source_kind"] == "not stated" and "safety net" in rows["max_rounds"]["source"]
    assert rows["embedding"]["source"].startswith("paper: ")
    assert {r["source_kind"] for r in param_rows(get("ccfc").config)} <= {"paper", "not stated", "departure",
                                                                         "project option"}


def test_a_method_without_marks_still_lists_its_parameters():
    class Plain(ProtocolConfig):
        k: int = Field(default=3, description="clusters")

    (row,) = param_rows(Plain)
    assert row["source"] == "" and row["source_kind"] == "" and row["default"] == "3"


def test_fcuif_marks_feddmvcs_parameters_again_without_changing_them():
    """FCUIF's Config re-marks some of FedDMVC's fields (its own paper states those values):
    type, default, bounds, description and order stay FedDMVC's."""
    base, fcuif = get("feddmvc").config, get("fcuif").config
    assert list(fcuif.model_fields)[: len(base.model_fields)] == list(base.model_fields)
    for name, f in base.model_fields.items():
        g = fcuif.model_fields[name]
        assert (g.annotation, g.default, g.metadata, g.description, g.alias) == \
            (f.annotation, f.default, f.metadata, f.description, f.alias), name
    assert source_text(base.model_fields["batch_size"]).startswith("not stated;")
    assert source_text(fcuif.model_fields["batch_size"]) == "paper: Sec. 4.1.3 (batch size 256)"

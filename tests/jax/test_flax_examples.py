"""The JAX examples run end to end at tiny sizes (their numbers are checked by the other
tests; here: they run, print what they promise and write their files)."""

import importlib.util
import os
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "jax")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses (Flax modules) look their module up
    spec.loader.exec_module(module)
    return module


def test_train_mlp(tmp_path, capsys):
    load("train_mlp").main(
        [
            "--hidden",
            "32",
            "--ffn",
            "64",
            "--tokens",
            "32",
            "--steps",
            "4",
            "--log-every",
            "2",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    out = capsys.readouterr().out
    assert "final loss  delayed" in out and "output_grad: amax" in out
    rows = (tmp_path / "run.csv").read_text().splitlines()
    assert rows[0] == "step,bf16,delayed,current,block,mxfp8,nvfp4" and len(rows) == 5
    assert "final loss    block" in out and "final loss    nvfp4" in out
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dense_dp_tp(capsys):
    load("dense_dp_tp").main(
        ["--tokens", "64", "--hidden", "32", "--features", "64", "--repeat", "1"]
    )
    out = capsys.readouterr().out
    assert "P(None, 'tp')" in out and "'all-gather': 0" in out
    assert float(out.split("max relative difference ")[1].split()[0]) < 1e-5


def test_transformer_layer(capsys):
    recipe = "delayed"
    load("transformer_layer").main(
        [
            "--batch",
            "2",
            "--seq",
            "16",
            "--hidden",
            "32",
            "--heads",
            "2",
            "--ffn",
            "64",
            "--repeat",
            "1",
            "--recipe",
            recipe,
        ]
    )
    out = capsys.readouterr().out
    assert float(out.split("FP8 vs plain: ")[1].split(";")[0]) < 0.1
    assert ("qkv/QmeshDotGeneral_0/input" in out) == (recipe == "delayed")


def _colors_in_png(path):
    """The set of RGB colours (0-255) of a PNG file, and its (height, width)."""
    import matplotlib.image
    import numpy as np

    img = np.asarray(matplotlib.image.imread(path))[..., :3]
    rgb = np.round(img * 255).astype(int).reshape(-1, 3)
    return {tuple(c) for c in np.unique(rgb, axis=0)}, img.shape[:2]


def test_line_plot_with_and_without_matplotlib(tmp_path, monkeypatch):
    png = load("png")
    curves = {"bf16": [3.0, 2.5, 2.0], "delayed": [[0, 3.1], [1, 2.4], [2, 2.1]]}
    png.line_plot(str(tmp_path / "mpl.png"), curves, title="loss")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    png.line_plot(str(tmp_path / "plain.png"), curves)
    monkeypatch.undo()
    for name in ("mpl.png", "plain.png"):
        colors, shape = _colors_in_png(tmp_path / name)
        assert shape == (400, 640), name
        for rgb in png.COLORS[:2]:  # one colour per curve, blue then red
            assert rgb in colors, (name, rgb)
    # The plain drawing has nothing but white, the axes' black and grey and the curves.
    plain, _ = _colors_in_png(tmp_path / "plain.png")
    assert plain <= {(255, 255, 255), (0, 0, 0), (200, 200, 200), *png.COLORS[:2]}
    # A colour given by name replaces that curve's place in the order (brown, not red).
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png.line_plot(str(tmp_path / "named.png"), curves, colors={"delayed": png.COLORS[5]})
    monkeypatch.undo()
    named, _ = _colors_in_png(tmp_path / "named.png")
    assert {png.COLORS[0], png.COLORS[5]} <= named and png.COLORS[1] not in named


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("--steps", "0", "--steps must be >= 1"),
        ("--hidden", "40", "--hidden must be a multiple of 32"),
    ],
)
def test_train_mlp_refuses_bad_sizes_up_front(option, value, message, tmp_path, capsys):
    # --steps 0 printed "final loss nan"; --hidden 40 failed in the fifth recipe's first step.
    with pytest.raises(SystemExit):
        load("train_mlp").main([option, value, "--out", str(tmp_path / "run")])
    assert message in capsys.readouterr().err

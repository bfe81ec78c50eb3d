"""experiments/presets.py: a preset file or name, with its argument, gives the ConfigDict the main job
gets from `--config=`; a file outside configs/ loads from its path; a wrong spec names the presets."""

import pytest

from experiments import presets


def test_a_path_a_name_and_an_absolute_path_give_the_same_config():
    from configs import tiny

    want = tiny.get_config("runlocal").to_json()
    assert presets.load("configs/tiny.py:runlocal").to_json() == want
    assert presets.load("tiny:runlocal").to_json() == want
    assert presets.load(f"{presets.CONFIGS / 'tiny.py'}:runlocal").to_json() == want
    assert presets.load("tiny").to_json() == tiny.get_config().to_json() != want
    assert presets.module("configs/tiny.py") is tiny and "python -m spade_jax.main" in tiny.__doc__


def test_a_file_outside_configs_loads_from_its_path(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("import ml_collections\n\n\ndef get_config(arg=None):\n"
                    "    return ml_collections.ConfigDict({'arg': arg or 'none'})\n")
    assert presets.load(str(path)).arg == "none" and presets.load(f"{path}:x=1").arg == "x=1"


def test_a_missing_preset_names_the_presets():
    assert {"tiny", "smollm2_135m", "qwen3_0p6b"} <= set(presets.names()) and "__init__" not in presets.names()
    with pytest.raises(ValueError, match=r"no preset file .*nope.*'tiny'"):
        presets.load("nope:runlocal")
    with pytest.raises(ValueError, match="configs/nope.py"):
        presets.split("configs/nope.py")

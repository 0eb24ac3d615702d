"""Corpus families over what the user types: ``key=value`` overrides and CLI arguments. See
``tests/robust/corpus.py``."""

from __future__ import annotations

from tests.robust.corpus_runs import RECIPE, REPO, SLURM_PROFILE, SLURM_RECIPE, TOKEN
from tests.robust.harness import Case

# --------------------------------------------------------------------------- overrides
OVERRIDES: dict[str, tuple[str, str]] = {
    # name: (override, key a rejection must name; "" when any clear line will do)
    "no-equals": ("grpo.max_num_steps", "grpo.max_num_steps"),
    "empty-key": ("=3", "=3"),
    "empty": ("", ""),
    "only-equals": ("=", ""),
    "double-dot": ("grpo..max_num_steps=1", "grpo..max_num_steps"),
    "leading-dot": (".grpo=1", ".grpo"),
    "space-in-key": ("grpo.max num=1", "grpo.max num"),
    "unknown-key": ("grpo.max_num_stpes=1", "grpo.max_num_stpes"),
    "unknown-top": ("bogus=1", "bogus"),
    "below-a-value": ("grpo.max_num_steps.x=1", "grpo.max_num_steps.x"),
    "section-to-scalar": ("policy=3", "policy"),
    "section-to-list": ("grpo=[1,2]", "grpo"),
    "anchor": ("logger.wandb.name=&a x", "logger.wandb.name"),
    "alias": ("logger.wandb.name=*a", "logger.wandb.name"),
    "tag": ("logger.wandb.name=!!python/name:os.system", "logger.wandb.name"),
    "anchor-in-list": ("policy.optimizer.betas=[&a 0.9, *a]", "policy.optimizer.betas"),
    "unclosed-list": ("policy.optimizer.betas=[0.9,", "policy.optimizer.betas"),
    "unclosed-map": ("policy.optimizer={lr: 1", "policy.optimizer"),
    "unclosed-quote": ('logger.wandb.name="abc', "logger.wandb.name"),
    "env-missing": ("logger.wandb.name=${oc.env:HPCRL_CORPUS_NOPE}", "logger.wandb.name"),
    "env-secret-not-passed": ("logger.wandb.name=${oc.env:GITHUB_PAT}", "logger.wandb.name"),
    "env-secret-passed": ("logger.wandb.name=${oc.env:HF_TOKEN}", "logger.wandb.name"),
    "env-secret-quoted": ('logger.wandb.name=${oc.env:"WANDB_API_KEY"}', "logger.wandb.name"),
    "env-secret-short": ("logger.wandb.name=${oc.env:SHORT_PASS}", "logger.wandb.name"),
    "env-secret-in-path": ("checkpointing.checkpoint_dir=/ckpt/${oc.env:SHORT_PASS}", "checkpointing.checkpoint_dir"),
    "env-secret-arithmetic": ("grpo.max_num_steps=${mul:${oc.env:SHORT_PASS},2}", "grpo.max_num_steps"),
    "env-secret-in-default": ("logger.wandb.name=${oc.env:HPCRL_CORPUS_NOPE,${oc.env:SHORT_PASS}}", "logger.wandb.name"),
    "env-secret-bad-type": ("cluster.num_nodes=${oc.env:SHORT_PASS}", "cluster.num_nodes"),
    "env-secret-in-env-vars": ("policy.megatron_cfg.env_vars.X=${oc.env:HF_TOKEN}", "policy.megatron_cfg.env_vars"),
    "secret-name-literal": ("policy.megatron_cfg.env_vars.HF_TOKEN=abc", "policy.megatron_cfg.env_vars"),
    "token-literal": (f"logger.wandb.name={TOKEN}", ""),
    "bad-reference": ("logger.wandb.name=${nope.nope}", "logger.wandb.name"),
    "self-reference": ("logger.wandb.name=${logger.wandb.name}", "logger.wandb.name"),
    "unknown-resolver": ("logger.wandb.name=${nope:x}", "logger.wandb.name"),
    "mandatory": ("logger.wandb.name=???", "logger.wandb.name"),
    "nan-lr": ("policy.optimizer.lr=nan", "policy.optimizer.lr"),
    "yaml-nan-lr": ("policy.optimizer.lr=.nan", "policy.optimizer.lr"),
    "inf-grad-norm": ("policy.max_grad_norm=.inf", "policy.max_grad_norm"),
    "negative-grad-norm": ("policy.max_grad_norm=-1", "policy.max_grad_norm"),
    "negative-lr": ("policy.optimizer.lr=-0.1", "policy.optimizer.lr"),
    "nan-temperature": ("policy.generation.temperature=.nan", "policy.generation.temperature"),
    "negative-temperature": ("policy.generation.temperature=-1", "policy.generation.temperature"),
    "save-period-zero": ("checkpointing.save_period=0", "checkpointing.save_period"),
    "keep-top-k-negative": ("checkpointing.keep_top_k=-1", "checkpointing.keep_top_k"),
    "nodes-1e20": ("cluster.num_nodes=1e20", "cluster.num_nodes"),
    "nodes-huge-int": ("cluster.num_nodes=100000000000000000000", "cluster.num_nodes"),
    "nodes-float": ("cluster.num_nodes=2.0", "cluster.num_nodes"),
    "nodes-negative": ("cluster.num_nodes=-2", "cluster.num_nodes"),
    "nodes-string": ("cluster.num_nodes=two", "cluster.num_nodes"),
    "nodes-bool": ("cluster.num_nodes=true", "cluster.num_nodes"),
    "nodes-list": ("cluster.num_nodes=[1]", "cluster.num_nodes"),
    "nodes-null": ("cluster.num_nodes=null", "cluster.num_nodes"),
    "batch-zero": ("policy.train_global_batch_size=0", "policy.train_global_batch_size"),
    "steps-negative": ("grpo.max_num_steps=-5", "grpo.max_num_steps"),
    "megatron-env-on-automodel": ("policy.megatron_cfg.env_vars.NCCL_DEBUG=INFO", "policy.megatron_cfg.env_vars"),
    "both-backends": ("policy.megatron_cfg.enabled=true", "policy.megatron_cfg.enabled"),
    "no-backend": ("policy.automodel_cfg.enabled=false", "policy.megatron_cfg.enabled"),
    "literal-choice": ("policy.precision=fp64", "policy.precision"),
    "data-missing": ("data.train_path=/nonexistent/hpcrl/train.jsonl", "data.train_path"),
    "data-directory": ("data.train_path=/", "data.train_path"),
    "data-relative-missing": ("data.train_path=missing.jsonl", "data.train_path"),
    "nul-value": ("logger.wandb.name=a\x00b", ""),
    "newline-value": ("logger.wandb.name=a\nb", ""),
    "huge-value": ("logger.wandb.name=" + "x" * 100_000, ""),
    "unicode-key": ("grpö.max_num_steps=1", "grpö.max_num_steps"),
    "dtensor-alias-unknown": ("policy.dtensor_cfg.bogus=1", "policy.dtensor_cfg.bogus"),
    "plus-plus": ("++grpo.bogus=1", "grpo.bogus"),
    # after --cluster too (issue 24): deleting a key the config does not set is refused;
    # deleting one it sets is a valid override (back to the default)
    "tilde-delete": ("~grpo.no_such_key", "~grpo.no_such_key"),
    "tilde-delete-set-key": ("~grpo.max_num_steps", ""),
    "env-vars-bad-name": ("policy.megatron_cfg.env_vars.1BAD=x", "policy.megatron_cfg.env_vars"),
    "model-overrides-junk": ("policy.megatron_cfg.model_overrides=3", "policy.megatron_cfg.model_overrides"),
    "betas-length": ("policy.optimizer.betas=[0.9]", "policy.optimizer.betas"),
    "top-p-zero": ("policy.generation.top_p=0", "policy.generation.top_p"),
    "ratio-clip-min-negative": ("loss_fn.ratio_clip_min=-1", "loss_fn.ratio_clip_min"),
    "ratio-clip-max-negative": ("loss_fn.ratio_clip_max=-0.2", "loss_fn.ratio_clip_max"),
    "prompts-per-step-huge": ("grpo.num_prompts_per_step=100000000000000000000", "grpo.num_prompts_per_step"),
    "prompts-per-step-1e20": ("grpo.num_prompts_per_step=1e20", "grpo.num_prompts_per_step"),
    "generations-huge": ("grpo.num_generations_per_prompt=100000000000000000000", "grpo.num_generations_per_prompt"),
    # the recipe's torch engine samples inside the training workers: no workers of its own
    "separate-torch-generation": ("policy.generation.colocated.enabled=false", "policy.generation.colocated.enabled"),
    # issue 26: accepted, then failing in the job
    "seed-2**64": ("grpo.seed=18446744073709551616", "grpo.seed"),
    "seed-negative": ("grpo.seed=-1", "grpo.seed"),
    "max-new-tokens-1e10": ("policy.generation.max_new_tokens=10000000000", "policy.generation.max_new_tokens"),
    "top-k-minus-5": ("policy.generation.top_k=-5", "policy.generation.top_k"),
    "max-sequence-1e14": ("policy.max_total_sequence_length=100000000000000", "policy.max_total_sequence_length"),
    "max-num-steps-2**63": ("grpo.max_num_steps=9223372036854775808", "grpo.max_num_steps"),
    "max-num-steps-10**400": ("grpo.max_num_steps=" + "1" + "0" * 400, "grpo.max_num_steps"),
    "data-not-jsonl": ("data.train_path=/etc/passwd", "data.train_path"),
    "data-a-device": ("data.train_path=/dev/zero", "data.train_path"),
    "data-url-with-password": ("data.train_path=https://corpus:Url7Pw9x@example.com/d.jsonl", "data.train_path"),
    "tiny-model-that-does-not-exist": ("policy.model_name=tiny:nope", "policy.model_name"),
    "self-doubling-value": ("logger.wandb.name=${logger.wandb.project}${logger.wandb.project}", ""),
}  # fmt: skip
#: What the output must say (a password that is no variable's value: hidden by its shape).
OVERRIDES_SAY = {
    "data-url-with-password": ("'https://corpus:<password hidden>@example.com/d.jsonl'",)
}
#: Overrides that are fine on their own (the command may accept them).
OVERRIDES_MAY_PASS = {"empty", "nul-value", "newline-value", "huge-value", "self-reference",
                      "validate-token-literal", "tilde-delete-set-key",
                      "self-doubling-value"}  # fmt: skip


def override_cases() -> list[Case]:
    cases = []
    for name, (override, key) in OVERRIDES.items():
        for command in ("validate", "render"):
            argv = (command, RECIPE, "--cluster", "local", override)
            if command == "render":
                argv += ("-o", "{case}/run")
            cases.append(
                Case(
                    family="overrides",
                    name=f"{command}-{name}",
                    argv=argv,
                    expect="any" if {name, f"{command}-{name}"} & OVERRIDES_MAY_PASS else "reject",
                    keys=(key,) if key else (),
                    says=OVERRIDES_SAY.get(name, ()),
                )
            )
    return cases


# --------------------------------------------------------------------------- CLI arguments
CLI_ARGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "no-command": ((), ()),
    "unknown-command": (("frobnicate",), ()),
    "render-no-recipe": (("render",), ()),
    "render-no-cluster": (("render", RECIPE), ()),
    "cluster-missing": (("render", RECIPE, "--cluster", "nope"), ("--cluster",)),
    "cluster-empty": (("render", RECIPE, "--cluster", ""), ("--cluster",)),
    "cluster-directory": (("render", RECIPE, "--cluster", "{case}"), ("--cluster",)),
    "cluster-dev-null": (("render", RECIPE, "--cluster", "/dev/null"), ()),
    "recipe-missing": (("render", "nope-recipe", "--cluster", "local"), ("recipe",)),
    "recipe-empty": (("render", "", "--cluster", "local"), ("recipe",)),
    "recipe-directory": (("render", "{case}", "--cluster", "local"), ("folder",)),
    "recipe-dev-null": (("render", "/dev/null", "--cluster", "local"), ()),
    "recipe-path-missing": (("render", "{case}/nope.yaml", "--cluster", "local"), ("recipe",)),
    "recipe-is-profile": (("render", str(SLURM_PROFILE), "--cluster", "local"), ()),
    "profile-is-recipe": (("render", RECIPE, "--cluster", str(REPO / "recipes" / f"{RECIPE}.yaml")), ()),
    "unknown-option": (("render", RECIPE, "--cluster", "local", "--frob"), ()),
    "stray-word": (("render", RECIPE, "--cluster", "local", "word"), ()),
    "logs-node-negative": (("logs", "--node", "-1", "{case}"), ()),
    "logs-node-word": (("logs", "--node", "x", "{case}"), ()),
    "logs-attempt-zero": (("logs", "--attempt", "0", "{case}"), ()),
    "status-runs-dir-missing": (("status", "--runs-dir", "/nope/runs"), ()),
    "status-runs-dir-file": (("status", "--runs-dir", "/dev/null"), ()),
    "status-runs-dir-proc": (("status", "--runs-dir", "/proc/self/fd"), ()),
    "report-out-proc": (("report", "{case}", "--out", "/proc/hpcrl"), ()),
    "sweep-no-grid": (("sweep", SLURM_RECIPE, "--cluster", "slurm-test", "--no-submit"), ("--grid",)),
    "sweep-grid-no-equals": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed", "--no-submit"), ("--grid",)),
    "sweep-grid-empty-key": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "=1,2", "--no-submit"), ("--grid",)),
    "sweep-grid-empty-value": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,,2", "--no-submit"), ("--grid",)),
    "sweep-grid-duplicate-points": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,1", "--no-submit", "-o", "{case}/sw"), ("grpo.seed",)),
    "sweep-grid-same-resolved-seed": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,01", "--no-submit", "-o", "{case}/sw"), ("grpo.seed",)),
    "sweep-grid-same-resolved-lr": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "policy.optimizer.kwargs.lr=1e-3,0.001", "--no-submit", "-o", "{case}/sw"), ("policy.optimizer.kwargs.lr",)),
    "sweep-zip-same-resolved": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--zip", "grpo.seed=1,+1", "--zip", "grpo.max_num_steps=2,2", "--no-submit", "-o", "{case}/sw"), ("grpo.seed",)),
    "sweep-grid-same-key-twice": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,2", "--grid", "grpo.seed=3", "--no-submit"), ("grpo.seed",)),
    "sweep-zip-lengths": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--zip", "grpo.seed=1,2", "--zip", "grpo.max_num_steps=1", "--no-submit"), ("--zip",)),
    "sweep-bad-point": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,x", "--no-submit", "-o", "{case}/sw"), ("grpo.seed",)),
    "sweep-unknown-key": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.sead=1,2", "--no-submit", "-o", "{case}/sw"), ("grpo.sead",)),
    "sweep-local-profile": (("sweep", RECIPE, "-c", "local", "--grid", "grpo.seed=1,2", "--no-submit", "-o", "{case}/sw"), ("scheduler",)),
    "sweep-wait-no-submit": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,2", "--no-submit", "--wait"), ("--no-submit",)),
    "sweep-out-file": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,2", "--no-submit", "-o", "/dev/null"), ()),
    "sweep-huge-grid": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=" + ",".join(map(str, range(3000))), "--no-submit", "-o", "{case}/sw"), ()),
    "submit-sbatch-refuses": (("submit", SLURM_RECIPE, "-c", "slurm-test", "-o", "{case}/run"), ("sbatch",)),
    "sweep-sbatch-refuses": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,2", "-o", "{case}/sw"), ("sbatch",)),
    "submit-no-sbatch": (("submit", SLURM_RECIPE, "-c", "slurm-test", "-o", "{case}/run"), ("Slurm",)),
    "show-bad-override": (("show", RECIPE, "-c", "local", "grpo.bogus=1"), ("grpo.bogus",)),
    "validate-secret-override": (("validate", RECIPE, "-c", "local", f"logger.wandb.name={TOKEN}"), ()),
    "show-secret-override": (("show", RECIPE, "-c", "local", f"logger.wandb.name={TOKEN}"), ()),
    "status-state-unknown": (("status", "--state", "EXPLODED"), ("--state",)),
    "logs-attempt-huge": (("logs", "--attempt", "99999999999999999999", "{case}"), ("--attempt",)),
    "render-out-2000-levels": (("render", RECIPE, "--cluster", "local", "-o", "{case}/" + "a/" * 2000), ("run_dir",)),
    "submit-tiny-model-that-does-not-exist": (("submit", RECIPE, "--cluster", "local", "policy.model_name=tiny:nope"), ("policy.model_name",)),
    "submit-job-python-lacks-vllm": (("submit", "grpo-tiny-vllm-1n-cpu", "--cluster", "local"), ("python",)),
    "help": (("--help",), ()),
    "render-help": (("render", "--help"), ()),
    "version": (("--version",), ()),
}  # fmt: skip
CLI_MAY_PASS = {
    "help",
    "render-help",
    "version",
    "status-runs-dir-proc",
    "validate-secret-override",
    "show-secret-override",
    "sweep-huge-grid",
    "report-out-proc",
    "sweep-local-profile",
}  # fmt: skip  (local sweeps run points in turn: a feature)


def cli_cases() -> list[Case]:
    return [
        Case(
            family="cli-arguments",
            name=name,
            argv=argv,
            expect="any" if name in CLI_MAY_PASS else "reject",
            keys=keys,
            sacct="missing" if name == "submit-no-sbatch" else "empty",
            deadline_s=60.0 if name == "sweep-huge-grid" else 30.0,
        )
        for name, (argv, keys) in CLI_ARGS.items()
    ]

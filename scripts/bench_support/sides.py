"""The benchmark's sides (what each runs) and fairseq trainers built the way fairseq_cli.train builds them.

    ls              ls_<arch>, our criterion, ls_adam (the plugin as documented)
    fairseq         <arch>, fairseq's criterion, adam (fairseq as users run it)
    fairseq_fused   <arch>, fairseq's criterion, torch's fused AdamW (bench_fused_adamw)
The criterion pair is the family's (fairseq_lightseq/models/families.py: ls_label_smoothed_cross_entropy /
label_smoothed_cross_entropy for translation, ls_cross_entropy / cross_entropy for the LM), the
adam pair fairseq_lightseq's OPTIMIZERS. Every other argument is identical.
"""
import os

# side -> (runs our model and criterion, optimizer: None = the library's (adam, ls_adam) pair)
SIDES = {"ls": (True, None), "fairseq": (False, None), "fairseq_fused": (False, "bench_fused_adamw")}


def train_args(family, data_bin: str, repo: str, side: str, arch_size: str, device: str, precision: str,
               shape, layers=None, extra=()):
    """fairseq-train arguments for one side of `family` (a bench_support.families.BenchFamily; see the
    module docstring); `shape` is (max_tokens, seq_len) (seq_len None for translation)."""
    from fairseq_lightseq.models.families import FAMILIES, PREFIX

    from .families import layer_args, shape_args

    lib = FAMILIES[family.library]
    ours = SIDES[side][0]
    arch = family.archs[arch_size]
    args = [data_bin, "--user-dir", os.path.join(repo, "fairseq_lightseq"), "--task", lib.task,
            "--arch", PREFIX + arch if ours else arch, *family.task_args, *optimizer_args(side),
            "--criterion", lib.criterion if ours else lib.native_criterion, *shape_args(family, *shape),
            *layer_args(family, layers), *run_args(device, precision)]
    return args + list(extra)


def optimizer_args(side: str) -> list:
    """The optimizer and learning-rate arguments of `side` (SIDES), the same for every family and task."""
    from fairseq_lightseq.models.families import OPTIMIZERS

    ours, optimizer = SIDES[side]
    native_adam, ls_adam = OPTIMIZERS[0][0]
    return ["--optimizer", optimizer or (ls_adam if ours else native_adam), "--adam-betas", "(0.9, 0.98)",
            "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000"]


def run_args(device: str, precision: str) -> list:
    """Seed, loader, logging, device and precision arguments of every side."""
    args = ["--seed", "1", "--num-workers", "0", "--log-format", "none"]
    if device == "cpu":
        args.append("--cpu")
    if precision in ("fp16", "bf16"):
        args.append("--" + precision)
    return args


def build_trainer(args_list):
    """(cfg, task, trainer) from fairseq-train arguments, as fairseq_cli.train builds them (train split
    loaded). fairseq 0.12's command line maps --bf16 to --tpu; tpu is reset so bf16 runs on this device,
    as `fairseq-train --user-dir fairseq_lightseq` does (fairseq_lightseq/patches/cli_config.py), which this
    script bypasses by building the Trainer itself."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=args_list)
    args.tpu = False
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return cfg, task, Trainer(cfg, task, model, criterion)


def build_model_and_criterion(args_list):
    """(task, model, criterion) without a Trainer (fp32, on the CPU): for counting saved bytes."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=args_list)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)

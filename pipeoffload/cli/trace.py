"""``pipeoffload trace compare RUN_TRACE``: a measured run above its simulation, in one Perfetto file."""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import (
    TRACE_JSON,
    check_distinct,
    check_extension,
    check_writable,
    read_input_text,
    write_atomic,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("trace", help="work with Chrome/Perfetto traces of runs")
    actions = parser.add_subparsers(dest="trace_command", metavar="ACTION", parser_class=type(parser))
    compare = actions.add_parser("compare", help="lay a runtime trace above its simulation in one trace file",
                                 description="lay a runtime trace above its simulation in one trace file")
    compare.add_argument("run_trace", metavar="RUN_TRACE",
                         help="a runtime trace (python -m pipeoffload.runtime --trace FILE, or write_chrome_trace)")
    compare.add_argument("-o", "--output", metavar="FILE.json",
                         help="the merged trace, a new .json file other than RUN_TRACE (default: RUN_TRACE with "
                              ".vs-sim.json)")
    compare.set_defaults(run=run_compare)
    parser.set_defaults(run=_no_action)


def _no_action(args: argparse.Namespace) -> int:
    raise ConfigError("give an action: compare (pipeoffload trace compare RUN_TRACE; see pipeoffload trace --help)")


def run_compare(args: argparse.Namespace) -> int:
    from pipeoffload.viz.trace_compare import compare_trace, read_trace_json

    source = Path(args.run_trace)
    try:
        data = read_trace_json(read_input_text(source))
    except FileNotFoundError:
        raise ConfigError(f"RUN_TRACE {source}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"RUN_TRACE {source}: not JSON ({err}); expected a Chrome trace from the runtime") from None
    except RecursionError:  # arrays or objects nested deeper than Python's JSON reader goes
        raise ConfigError(f"RUN_TRACE {source}: nested too deeply to be a Chrome trace; expected one from the "
                          "runtime") from None
    except OSError as err:  # a folder, a file without read permission
        raise ConfigError(f"RUN_TRACE {source}: cannot read it ({err.strerror}); give a trace file") from None
    if args.output is not None:
        out, what = Path(args.output), f"-o {shlex.quote(args.output)}"
    else:  # the user gave no -o: name the default output, and -o only as the way around it
        out = source.with_name(source.stem + ".vs-sim.json")
        what = f"the default output {out} (beside RUN_TRACE; give another with -o FILE.json)"
    check_writable(out, what)
    check_distinct([("-o" if args.output is not None else "the default output", out)], inputs=[("RUN_TRACE", source)])
    check_extension(out, what, *TRACE_JSON)
    merged, timeline, run = compare_trace(data)
    write_atomic(out, json.dumps(merged))
    other = merged["otherData"]
    print(f"{run.schedule.num_ranks} ranks: measured step {_ms(other['measured_step_s'])} (from the first rank's "
          f"first action to the last action; the ranks' first actions up to {_ms(other['start_skew_s'])} apart), simulated "
          f"with its measured action durations and free transfers {_ms(other['simulated_makespan_s'])} (every rank "
          "from 0; the difference: the start skew and waits the cost model does not have)")
    for r in other["per_rank"]:
        print(f"  rank {r['rank']}: measured {_ms(r['measured_span_s'])} from its first action, simulated "
              f"{_ms(r['simulated_end_s'])}; first action {_ms(r['start_skew_s'])} after the first rank's"
              + (f"; its step took {_ms(r['wall_s'])}, {_ms(r['outside_actions_s'])} of it outside its actions"
                 if "wall_s" in r else ""))
    print(f"wrote {out} (open in https://ui.perfetto.dev: measured ranks first, then simulated)")
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"

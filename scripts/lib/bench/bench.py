#!/usr/bin/env python3
"""The command line behind scripts/bench: parses a subcommand's options into that
benchmark's options, runs it (common.run_with_procs stops, by PID, every process it
started), then prints the result with its provenance header and writes it to
bench-results/<UTC timestamp>-<subcommand>.md (common.write_result).

  bench.py overhead|quality|prefix-cache|sched|overload|flow-control [--command TEXT] [options]
  bench.py quality-sim [--command TEXT] [quality-sim's own options]
  bench.py slo [--command TEXT] [slo-sim's own options]
  bench.py breakdown [--command TEXT] [--candidate-wasm PATH [--candidate-label TEXT]]
                     [host-calls' own options]
  bench.py autoscale|soak|ladder|prices|footprint|slo-envoy [--command TEXT] [that benchmark's own options]

Every subcommand but quality-sim accepts every option (scripts/bench all passes the same
options to overhead, sched and quality) and uses the ones that concern it. Called by
scripts/bench after it has built everything; not meant to be run directly.

The benchmarks: overhead.py, quality.py, prefix_cache.py, sched.py, overload.py, flow_control_bench.py,
quality_sim.py, slo_sim.py, slo_envoy.py, breakdown.py, ladder.py, prices.py, footprint.py; what they share: common.py.
"""
import argparse
import sys

import autoscale
import batch
import breakdown
import ladder
import common
import flow_control_bench
import footprint
import overhead
import overload
import prices
import prefix_cache
import quality
import quality_sim
import slo_envoy
import slo_sim
import sched
import soak

SUBCOMMANDS = ["overhead", "quality", "prefix-cache", "sched", "overload", "flow-control", "batch"]


def parser():
    """The options of every subcommand but quality-sim. Defaults that depend on the
    subcommand (--servers, --seconds, the workload's lengths) are None here."""
    p = argparse.ArgumentParser(prog="bench.py")
    p.add_argument("what", choices=SUBCOMMANDS)
    p.add_argument("--command", default="scripts/bench", help="the command line, for the provenance header")
    p.add_argument("--no-append", action="store_true",
                   help="accepted and ignored: results are never appended to BENCHMARKS.md")
    p.add_argument("--no-sglang", action="store_true")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--candidate", help="another checkout: adds a side with its filter (its render.py and .wasm)")
    p.add_argument("--candidate-label", default="", help="what the candidate is (recorded with the table)")
    p.add_argument("--candidate-wasm", help="the candidate's .wasm [DIR/target/wasm32-wasip1/release/epp_filter.wasm]")
    p.add_argument("--servers", type=int)
    p.add_argument("--seconds", type=float)
    # overhead (--rounds also overload)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--saturation-concurrency", type=int, default=32)
    # quality (the workload's lengths also overload and flow-control)
    p.add_argument("--qps")
    p.add_argument("--groups", type=int)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--system-prompt-len", type=int)
    p.add_argument("--question-len", type=int)
    p.add_argument("--output-len", type=int)
    p.add_argument("--zipf", type=float, default=0.0)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--kv-blocks", type=int)
    p.add_argument("--warmup", type=float)
    # prefix-cache
    p.add_argument("--precise-config", help="the KV-events side's filter configuration")
    # sched
    p.add_argument("--warm-up-time", type=float, default=1)
    p.add_argument("--measurement-time", type=float, default=2)
    p.add_argument("--limit", type=int, default=900, help="seconds for cargo bench")
    # overload, flow-control
    p.add_argument("--factor", type=float, default=2.0, help="offered load ÷ measured capacity")
    p.add_argument("--qps-overload", type=float, default=None, help="offered QPS (instead of --factor)")
    p.add_argument("--tenant-weights", default="10,1,1")
    p.add_argument("--ttl", type=float, default=15)
    p.add_argument("--band-limits", default="500,60,30")
    p.add_argument("--timeout", type=float, default=45)
    p.add_argument("--calibrate", type=float, default=10)
    p.add_argument("--warm", type=float, default=5)
    p.add_argument("--sample-period", type=float, default=0.5)
    p.add_argument("--cooldown", type=float, default=0)
    p.add_argument("--parked", type=int, default=10000)
    # batch
    p.add_argument("--batch", type=int, default=2000, help="batch backlog")
    p.add_argument("--load", type=float, default=0.6, help="interactive QPS ÷ measured capacity")
    p.add_argument("--baselines", default="0.05,0.25", help="one dispatcher side per baseline B")
    p.add_argument("--dispatcher-metrics", default="envoy", choices=["envoy", "servers"],
                   help="the dispatcher's saturation source: Envoy's stats or the servers' /metrics")
    p.add_argument("--lead", type=float, default=5)
    p.add_argument("--vllm-priority", default="both", choices=["off", "both", "only"],
                   help="batch: sides whose servers use --scheduling-policy priority and whose dispatcher "
                        "sends --request-priority 10 (besides the fcfs sides, instead of them, or none)")
    return p


def given(value, default):
    """value unless the option was not given (None)."""
    return default if value is None else value


def candidate_of(a):
    return common.candidate(a.candidate, a.candidate_wasm, a.candidate_label)


def overhead_options(a):
    return overhead.OverheadOptions(
        servers=given(a.servers, 2), workers=a.workers, seconds=given(a.seconds, 3), rounds=a.rounds,
        saturation_concurrency=a.saturation_concurrency, sglang=not a.no_sglang, candidate=candidate_of(a))


def quality_options(a):
    return quality.QualityOptions(
        servers=given(a.servers, 4), workers=a.workers, seconds=given(a.seconds, 20),
        qps=common.split_list(given(a.qps, "4,8,12"), float), groups=given(a.groups, 32),
        prompts_per_group=a.prompts_per_group, system_prompt_len=given(a.system_prompt_len, 1024),
        question_len=given(a.question_len, 128), output_len=given(a.output_len, 64), zipf=a.zipf,
        max_num_seqs=a.max_num_seqs, kv_blocks=given(a.kv_blocks, 1024), warmup=given(a.warmup, 15),
        sglang=not a.no_sglang, candidate=candidate_of(a))


def prefix_cache_options(a):
    return prefix_cache.PrefixCacheOptions(
        servers=given(a.servers, 4), workers=a.workers, seconds=given(a.seconds, 20),
        qps=common.split_list(given(a.qps, "4,8"), float), groups=given(a.groups, 32),
        prompts_per_group=a.prompts_per_group, system_prompt_len=given(a.system_prompt_len, 1024),
        question_len=given(a.question_len, 128), output_len=given(a.output_len, 64),
        max_num_seqs=a.max_num_seqs, kv_blocks=given(a.kv_blocks, 384), warmup=given(a.warmup, 10),
        precise_config=a.precise_config or "")


def sched_options(a):
    return sched.SchedOptions(warm_up_time=a.warm_up_time, measurement_time=a.measurement_time, limit=a.limit)


def overload_options(a, default_seconds):
    """The overload shape (smaller prompts than quality's); also flow-control's."""
    return overload.OverloadOptions(
        servers=given(a.servers, 2), workers=a.workers, seconds=given(a.seconds, default_seconds),
        rounds=a.rounds, max_num_seqs=a.max_num_seqs, groups=given(a.groups, 16),
        system_prompt_len=given(a.system_prompt_len, 256), question_len=given(a.question_len, 64),
        output_len=given(a.output_len, 32), factor=a.factor, qps_overload=a.qps_overload or 0.0,
        tenant_weights=common.split_list(a.tenant_weights), ttl=a.ttl,
        band_limits=common.split_list(a.band_limits), timeout=a.timeout, calibrate=a.calibrate, warm=a.warm,
        sample_period=a.sample_period, cooldown=a.cooldown)


def batch_options(a):
    return batch.BatchOptions(
        servers=given(a.servers, 2), workers=a.workers, max_num_seqs=a.max_num_seqs, groups=given(a.groups, 16),
        system_prompt_len=given(a.system_prompt_len, 256), question_len=given(a.question_len, 64),
        output_len=given(a.output_len, 32), load=a.load, seconds=given(a.seconds, 90), lead=a.lead,
        batch=a.batch, baselines=tuple(common.split_list(a.baselines, float)), calibrate=a.calibrate,
        metrics=a.dispatcher_metrics, vllm_priority=a.vllm_priority)


def flow_control_options(a):
    return flow_control_bench.FlowControlOptions(parked=a.parked, side=overload_options(a, 20))


def quality_sim_argv(argv, command="scripts/bench quality-sim"):
    """(the command line for the header, the simulator's own arguments) of
    `quality-sim|slo [--command TEXT] [--no-append] ARGS...`."""
    rest = []
    it = iter(argv)
    for arg in it:
        if arg == "--command":
            command = next(it, command)
        elif arg == "--no-append":
            pass  # accepted and ignored, as for the other subcommands
        else:
            rest.append(arg)
    return command, rest


def breakdown_options(argv):
    """(the command line for the header, options) of `breakdown [--command TEXT]
    [--candidate-wasm PATH] [--candidate-label TEXT] ARGS...`."""
    command, o = "scripts/bench breakdown", breakdown.BreakdownOptions()
    it = iter(argv)
    for arg in it:
        if arg == "--command":
            command = next(it, command)
        elif arg == "--candidate-wasm":
            o.candidate_wasm = next(it, None)
        elif arg == "--candidate-label":
            o.candidate_label = next(it, "")
        elif arg == "--no-append":
            pass
        else:
            o.args.append(arg)
    return command, o


def parse(argv):
    """(subcommand, command line for the header, module, options)."""
    if argv and argv[0] == "breakdown":
        command, o = breakdown_options(argv[1:])
        return "breakdown", command, breakdown, o
    if argv and argv[0] in ("autoscale", "soak", "ladder", "prices", "footprint", "slo-envoy"):
        rest = list(argv[1:])
        command = f"scripts/bench {argv[0]}"
        if "--command" in rest:
            i = rest.index("--command")
            command = rest[i + 1]
            del rest[i:i + 2]
        module = {"autoscale": autoscale, "soak": soak, "ladder": ladder, "prices": prices, "footprint": footprint,
                  "slo-envoy": slo_envoy}[argv[0]]
        return argv[0], command, module, module.options(rest)
    if argv and argv[0] == "quality-sim":
        command, rest = quality_sim_argv(argv[1:])
        return "quality-sim", command, quality_sim, quality_sim.QualitySimOptions(rest)
    if argv and argv[0] == "slo":
        command, rest = quality_sim_argv(argv[1:], "scripts/bench slo")
        return "slo", command, slo_sim, slo_sim.SloSimOptions(rest)
    a = parser().parse_args(argv)
    build = {"overhead": (overhead, overhead_options),
             "quality": (quality, quality_options),
             "prefix-cache": (prefix_cache, prefix_cache_options),
             "sched": (sched, sched_options),
             "overload": (overload, lambda a: overload_options(a, 30)),
             "flow-control": (flow_control_bench, flow_control_options),
             "batch": (batch, batch_options)}
    module, options = build[a.what]
    return a.what, a.command, module, options(a)


def main():
    subcommand, command, module, options = parse(sys.argv[1:])
    load_before = common.loadavg()
    result = common.run_with_procs(lambda procs: module.run(options, procs))
    common.write_result(subcommand, result, command, load_before)


if __name__ == "__main__":
    main()

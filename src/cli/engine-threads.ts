/**
 * The default number of engine (llama.cpp) CPU threads for this host.
 *
 * Measured with bench/threads.mjs (docs/benchmarks.md): on a 2-core machine one thread gives 2,302 / 2,711 / 2,262
 * tok/s at concurrency 1 / 4 / 8 and two threads 61 / 17 / 46 — ggml's threads busy-wait on each other when no core
 * is spare, so the gateway (and anything else) must keep a core. Hence: 1 thread on up to 2 logical CPUs; otherwise
 * one thread per physical core minus one core for the gateway (hyper-threads share a core's arithmetic units and
 * only add contention to ggml's matrix kernels).
 */
import fs from "node:fs";
import os from "node:os";

/** The CPUs a host offers. */
export interface HostCpus {
  /** Logical CPUs this process may use (os.availableParallelism). */
  logicalCpus: number;
  /** Physical cores (distinct core ids in /proc/cpuinfo), or logicalCpus when unknown. */
  physicalCores: number;
}

/** The rule, as stated in `--help`. */
export const ENGINE_THREADS_RULE = "1 on hosts with <= 2 CPUs, else physical cores - 1 (one core left for the gateway; bench/threads.mjs)";

/** Default engine threads for a host: see the module comment and {@link ENGINE_THREADS_RULE}. */
export function defaultEngineThreads(host: HostCpus): number {
  if (host.logicalCpus <= 2) return 1;
  // Never more threads than the process may use (a container's CPU set can be smaller than the machine's cores).
  return Math.max(1, Math.min(host.physicalCores, host.logicalCpus) - 1);
}

/** Count distinct (physical id, core id) pairs in /proc/cpuinfo text; null when it names none. */
export function physicalCoresFromCpuinfo(cpuinfo: string): number | null {
  const cores = new Set<string>();
  let physical = "0";
  for (const line of cpuinfo.split("\n")) {
    const [key, value] = line.split(":").map((s) => s.trim());
    if (key === "physical id") physical = value ?? "0";
    else if (key === "core id") cores.add(`${physical}/${value}`);
  }
  return cores.size > 0 ? cores.size : null;
}

/** This host's CPUs. */
export function hostCpus(): HostCpus {
  const logicalCpus = os.availableParallelism();
  let physical: number | null = null;
  try {
    physical = physicalCoresFromCpuinfo(fs.readFileSync("/proc/cpuinfo", "utf8"));
  } catch {
    /* not Linux: count logical CPUs */
  }
  return { logicalCpus, physicalCores: physical ?? logicalCpus };
}

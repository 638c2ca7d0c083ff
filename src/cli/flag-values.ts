/**
 * The value schemas of `keel serve` flags: each turns the string written on the command line (or in a
 * `--config_path` entry) into its typed value, or fails with a message that names the flag (`--name …`; a config
 * entry's message drops the dashes).
 *
 * @module
 */
import { z } from "zod";

/** A flag's value: from the string as written to its typed value. */
export type FlagValue<T> = z.ZodType<T, string>;

/** A value checked by `parse`, which throws Error with the message to report (checks that read best as code). */
export function checked<T>(parse: (raw: string) => T): FlagValue<T> {
  return z.string().transform((raw, ctx) => {
    try {
      return parse(raw);
    } catch (err) {
      ctx.issues.push({ code: "custom", message: (err as Error).message, input: raw });
      return z.NEVER;
    }
  });
}

/** Any string, as given. */
export const text: FlagValue<string> = z.string();

/** An integer in [min, max], written in decimal. */
export function int(name: string, min: number, max = Number.MAX_SAFE_INTEGER): FlagValue<number> {
  return z
    .string()
    .refine((v) => /^-?\d+$/.test(v.trim()) && Number.isSafeInteger(Number(v)) && Number(v) >= min && Number(v) <= max, {
      error: (issue) => `--${name} must be an integer between ${min} and ${max}, got "${String(issue.input)}"`,
    })
    .transform(Number);
}

/** A number of GB (10^9 bytes) >= 0; fractions allowed. */
export function gb(name: string): FlagValue<number> {
  return z
    .string()
    .refine((v) => v.trim() !== "" && Number.isFinite(Number(v)) && Number(v) >= 0 && Number(v) <= 1 << 20, {
      error: (issue) => `--${name} must be a number of GB >= 0, got "${String(issue.input)}"`,
    })
    .transform(Number);
}

/** One of `values`, typed as their union. */
export function oneOf<const V extends readonly [string, ...string[]]>(name: string, values: V): FlagValue<V[number]> {
  return z.enum(values, { error: (issue) => `--${name} must be one of ${values.join(", ")}, got "${String(issue.input)}"` }) as unknown as FlagValue<V[number]>;
}

/** true or false. */
export function bool(name: string): FlagValue<boolean> {
  return z.enum(["true", "false"], { error: (issue) => `--${name} must be true or false, got "${String(issue.input)}"` }).transform((v) => v === "true");
}

/** A flag Keel refuses whatever its value: why, and what to use instead. Its value is never set. */
export function refused(name: string, why: string): FlagValue<undefined> {
  return z
    .string()
    .refine(() => false, { error: () => `--${name} is not supported: ${why}` })
    .transform(() => undefined);
}

/** The first problem of `value` for `raw`, or its parsed value. */
export function parseValue<T>(value: FlagValue<T>, raw: string): { ok: true; value: T } | { ok: false; problem: string } {
  const r = value.safeParse(raw);
  return r.success ? { ok: true, value: r.data } : { ok: false, problem: r.error.issues.map((i) => i.message).join("; ") };
}

/** `--target_device` values → the engine's device: CPU never touches a GPU; GPU must get one; AUTO may. */
export function parseTargetDevice(v: string): "cpu" | "gpu" | "auto" {
  if (v === "CPU") return "cpu";
  if (v === "GPU" || v === "GPU.0") return "gpu";
  if (v === "AUTO" || v.startsWith("AUTO:")) return "auto";
  if (/^GPU\.\d+$/.test(v)) {
    throw new Error(`--target_device ${v}: Keel cannot pick a GPU by index; make that GPU the only visible one (CUDA_VISIBLE_DEVICES=${v.slice(4)} or GGML_VK_VISIBLE_DEVICES=${v.slice(4)}) and pass --target_device GPU`);
  }
  if (v === "NPU" || v.startsWith("HETERO") || v.startsWith("MULTI")) throw new Error(`--target_device ${v} is not supported: Keel runs either engine on the CPU or one GPU (CPU, GPU, GPU.0, AUTO)`);
  throw new Error(`--target_device must be one of CPU, GPU, GPU.0, AUTO, got "${v}"`);
}

/** The value of `raw` under `value`. @throws Error with its problem (for checks built on other flags' schemas). */
export function must<T>(value: FlagValue<T>, raw: string): T {
  const r = parseValue(value, raw);
  if (!r.ok) throw new Error(r.problem);
  return r.value;
}

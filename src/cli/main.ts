/**
 * The `keel` command (bin/keel.mjs): `keel serve [flags]` (OVMS-style flag names), `keel fetch`, `keel make-model`.
 *
 * The one place that ends the process: the commands throw a {@link CliError} carrying the exit code (2: the command
 * line; 1: the model, the host or the network), and a served gateway exits here once its shutdown drain has ended.
 *
 * @module
 */
import { CliError } from "./cli-error.js";
import { usage } from "./flag-table.js";
import { serve, type ServeEnd } from "./serve.js";

/** Entry point of the `keel` bin. */
export async function main(argv: string[]): Promise<void> {
  const [cmd, ...rest] = argv;
  if (cmd === "serve") {
    let end: ServeEnd;
    try {
      end = await serve(rest);
    } catch (err) {
      if (!(err instanceof CliError)) throw err;
      process.stderr.write(`keel serve: ${err.message}\n${err.hint !== undefined ? `${err.hint}\n` : ""}`);
      process.exit(err.exitCode);
    }
    // A drained gateway may still hold handles (the log file, timers): the process ends here, not when they close.
    if (end === "drained") process.exit(0);
    return;
  }
  if (cmd === "fetch") {
    const { main: fetch } = await import("../model/fetch-command.js");
    process.exitCode = await fetch(rest);
    return;
  }
  if (cmd === "make-model" && rest[0] === "--hybrid-ir") {
    // The tiny hybrid (linear-attention) OpenVINO IR: made once into Keel's cache; prints its folder.
    const { ensureHybridModel } = await import("../engine-openvino/hybrid-model.js");
    try {
      process.stdout.write(`${await ensureHybridModel({ log: (line) => process.stderr.write(`keel: ${line}\n`) })}\n`);
    } catch (err) {
      process.stderr.write(`keel make-model --hybrid-ir: ${(err as Error).message}\n`);
      process.exitCode = 1;
    }
    return;
  }
  if (cmd === "make-model") {
    const { main: makeModel } = await import("../model/make-model.js");
    process.exitCode = makeModel(rest);
    return;
  }
  const help = cmd === "--help" || cmd === "-h";
  process.stderr.write(`${cmd && !help ? `keel: unknown command "${cmd}"\n\n` : ""}${usage()}\n`);
  process.exit(help ? 0 : 2);
}

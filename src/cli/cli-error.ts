/**
 * How a `keel` command ends early: a typed error carrying its exit code, thrown wherever the command finds it cannot go
 * on and turned into the message and the exit by `main` (cli/main.ts), the one place that ends the process.
 *
 * @module
 */

/** The exit codes of `keel`: 2 = the command line is wrong; 1 = the model, the host or the network failed it. */
export type ExitCode = 1 | 2;

/** A command that cannot go on: what to tell the operator and the exit code. */
export class CliError extends Error {
  /**
   * @param message the line printed after `keel serve: `
   * @param hint a line printed after it as is (e.g. where to read the list of flags)
   */
  constructor(
    readonly exitCode: ExitCode,
    message: string,
    readonly hint?: string,
  ) {
    super(message);
    this.name = "CliError";
  }
}

/**
 * Where and how the gateway's log lines are written: JSON lines (pino's own format, for log collectors) or a short
 * human-readable line per event on a terminal (`--log_format text`), to stdout or to a file (`--log_path`).
 * pino-pretty is not a dependency: the text format is this small formatter.
 */
import path from "node:path";
import pino, { type DestinationStream } from "pino";
import { makeDirsSync } from "../../model/make-dirs.js";

export type LogFormat = "text" | "json";

/** JSON unless stdout is a terminal (a person reads it), as `--log_format` defaults. */
export function defaultLogFormat(stdoutIsTty: boolean): LogFormat {
  return stdoutIsTty ? "text" : "json";
}

/** pino's numeric levels → the names printed in text lines. */
const LEVEL_NAMES: Record<number, string> = { 10: "TRACE", 20: "DEBUG", 30: "INFO", 40: "WARN", 50: "ERROR", 60: "FATAL" };

/** Fields every line carries that the text format prints in its prefix (or drops) instead of as key=value. */
const PREFIX_FIELDS = new Set(["level", "time", "pid", "hostname", "msg", "component"]);

/** One field as `key=value`: strings bare unless they hold spaces or quotes, everything else as JSON. */
function field(key: string, value: unknown): string {
  const text = typeof value === "string" && !/[\s"=]/.test(value) && value !== "" ? value : JSON.stringify(value);
  return `${key}=${text}`;
}

/**
 * Turn one pino JSON line into `HH:MM:SS.mmm LEVEL component message key=value …` (UTC time). A line that is not a
 * JSON object is returned unchanged.
 */
export function formatLogLine(line: string): string {
  let rec: Record<string, unknown>;
  try {
    const parsed: unknown = JSON.parse(line);
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return line;
    rec = parsed as Record<string, unknown>;
  } catch {
    return line;
  }
  const time = typeof rec["time"] === "number" ? new Date(rec["time"]).toISOString().slice(11, 23) : "--:--:--.---";
  const level = typeof rec["level"] === "number" ? (LEVEL_NAMES[rec["level"]] ?? String(rec["level"])) : String(rec["level"] ?? "").toUpperCase();
  // A line the engine wrote, relayed by the gateway under `engine`: printed as the engine's, its fields beside the
  // gateway's (the gateway's own message is the engine's).
  const relayed = rec["engine"];
  const engine = typeof relayed === "object" && relayed !== null && !Array.isArray(relayed) ? (relayed as Record<string, unknown>) : null;
  // A line the engine printed outside its JSON log (its stderr, `engineStream`) is the engine's too.
  const component = engine || rec["engineStream"] !== undefined ? "engine" : typeof rec["component"] === "string" ? rec["component"] : "-";
  const own = Object.entries(rec).filter(([k]) => !(engine && k === "engine"));
  const extras = [...own, ...(engine ? Object.entries(engine) : [])]
    .filter(([k, v]) => !PREFIX_FIELDS.has(k) && v !== undefined)
    .map(([k, v]) => field(k, v));
  // One event, one line: a message with line breaks (an OpenVINO exception's stack of "Exception from …") keeps them as \n.
  const msg = String(rec["msg"] ?? "").trimEnd().replace(/\r?\n/g, "\\n");
  return [time, level.padEnd(5), component, msg, ...extras].join(" ");
}

/**
 * The destination of the gateway's logger: stdout, or the file at `path` (appended; created if missing), in the given
 * format. @throws Error when the log file cannot be opened.
 */
export function logDestination(opts: { format: LogFormat; path?: string | undefined }): DestinationStream {
  // The log file's folder is created one level at a time: a recursive mkdir under /proc never returns (it spins).
  if (opts.path !== undefined) makeDirsSync(path.dirname(path.resolve(opts.path)));
  // pino's own destination (sonic-boom) handles a full pipe (EAGAIN); synchronous so that a crash loses no line.
  const sink = pino.destination({ dest: opts.path ?? 1, sync: true, append: true });
  if (opts.format === "json") return sink;
  return {
    write(chunk: string): void {
      // pino writes whole lines, each ending in "\n".
      sink.write(chunk.split("\n").filter((l) => l !== "").map((l) => formatLogLine(l) + "\n").join(""));
    },
  };
}

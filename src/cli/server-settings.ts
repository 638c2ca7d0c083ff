/**
 * What every `keel serve` gateway gets from the options, one model or several (`--config_path`): the log, the API key,
 * CORS, the HTTP limits, and the engine command override; and the listen step with its message for a port in use.
 *
 * @module
 */
import path from "node:path";
import { loadApiKey } from "../gateway/http/auth.js";
import { defaultLogFormat, logDestination } from "../gateway/http/logging.js";
import { startGateway, type Gateway, type GatewayOptions } from "../gateway/server.js";
import type { EngineCommand } from "../protocol/engine-config.js";
import { CliError } from "./cli-error.js";
import type { ServeOptions } from "./flags.js";

/** The gateway options every served model set shares (what a model set adds: its models and engine). */
export type ServerSettings = Pick<
  GatewayOptions,
  "host" | "port" | "bodyLimit" | "maxQueuedRequests" | "requestTimeoutMs" | "maxStreamBuffer" | "engineStallTimeoutMs" | "logLevel" | "logDestination" | "apiKey" | "cors" | "metricsList"
>;

/** `--log_level`'s values → the logger's levels. */
const LOG_LEVELS = { TRACE: "trace", DEBUG: "debug", INFO: "info", WARNING: "warn", ERROR: "error" } as const;

/**
 * The server's settings from the options; reads what must be read before a model loads (the API key file, the log
 * file), and sets KEEL_CACHE_DIR from `--cache_dir` (model-cache.ts reads it).
 * @throws CliError (exit 2) when the log file cannot be opened or the API key cannot be read
 */
export function serverSettings(o: ServeOptions, env: NodeJS.ProcessEnv = process.env): ServerSettings {
  if (o.cache_dir !== undefined) env["KEEL_CACHE_DIR"] = path.resolve(o.cache_dir);
  const logFormat = o.log_format ?? defaultLogFormat(process.stdout.isTTY === true);
  let logSink: ServerSettings["logDestination"];
  try {
    logSink = logDestination({ format: logFormat, path: o.log_path });
  } catch (err) {
    throw new CliError(2, `--log_path ${String(o.log_path)} cannot be opened: ${(err as Error).message}`);
  }
  // With a log file nothing else is printed: say once, on stderr, where the log goes.
  if (o.log_path !== undefined) process.stderr.write(`keel serve: logging to ${path.resolve(o.log_path)} (${logFormat})\n`);
  // The API key is read before the model loads: an unreadable key file is a startup error, not a late surprise.
  let apiKey: string | null;
  try {
    apiKey = loadApiKey(o.apiKeyFile, env);
  } catch (err) {
    throw new CliError(2, (err as Error).message);
  }
  return {
    host: o.rest_bind_address,
    port: o.rest_port,
    bodyLimit: o.max_request_body,
    maxQueuedRequests: o.max_queued_requests,
    requestTimeoutMs: o.request_timeout * 1000,
    maxStreamBuffer: o.max_stream_buffer,
    engineStallTimeoutMs: o.engine_stall_timeout * 1000,
    logLevel: LOG_LEVELS[o.log_level],
    logDestination: logSink,
    apiKey,
    cors: { origins: o.allowedOrigins, methods: o.allowedMethods, headers: o.allowedHeaders, credentials: o.allowCredentials ?? false },
    ...(o.metricsList !== undefined ? { metricsList: o.metricsList } : {}),
  };
}

/** Start the gateway. @throws CliError (exit 1) when it cannot listen, naming a port already in use */
export async function listen(options: GatewayOptions): Promise<Gateway> {
  try {
    return await startGateway(options);
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const what = e.code === "EADDRINUSE" ? `port ${options.port} on ${options.host} is already in use` : e.message;
    throw new CliError(1, `cannot listen: ${what}`);
  }
}

/**
 * KEEL_ENGINE_COMMAND (a JSON {@link EngineCommand}, e.g. `{"command":"python3","args":["worker.py"]}`): it overrides
 * whichever engine `--engine` chose (tests run fakes this way); null when unset.
 * @throws CliError (exit 2) when it is set but not such a JSON
 */
export function engineCommandOverride(env: NodeJS.ProcessEnv = process.env): EngineCommand | null {
  const raw = env["KEEL_ENGINE_COMMAND"];
  if (!raw) return null;
  try {
    const c = JSON.parse(raw) as EngineCommand;
    if (typeof c.command === "string" && Array.isArray(c.args) && c.args.every((a) => typeof a === "string")) return c;
  } catch {
    /* reported below */
  }
  throw new CliError(2, 'KEEL_ENGINE_COMMAND must be JSON like {"command":"node","args":["dist/engine/main.js"]}');
}

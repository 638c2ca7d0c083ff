/**
 * OVMS's model-status routes: `GET /v1/config` (every model's version status), `GET /v2/models/{name}/ready`
 * (200 when that model is ready, else 503) and `POST /v1/config/reload` (re-read the config file; model-set.ts applies
 * it). Readiness of the whole server (`/v2/health/ready`) is in http-app.ts.
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Logger } from "pino";
import { invalidConfig, modelNotFound, noConfigFile, routeNotFound, shuttingDown } from "../http/errors.js";
import { toErrorBody } from "../http/error-envelope.js";
import type { ModelSet, ModelSpec } from "../models/model-set.js";

/** One model's entry of `GET /v1/config`, in OVMS's shape (one version, "1"). */
export function ovmsModelStatus(state: string): unknown {
  return { model_version_status: [{ version: "1", state, status: { error_code: "OK", error_message: "OK" } }] };
}

/** `GET /v1/config`'s body: every serving model by name. */
export function configStatus(models: ModelSet): Record<string, unknown> {
  return Object.fromEntries(models.servingUnits().map((u) => [u.spec.name, ovmsModelStatus(u.ovmsState())]));
}

/**
 * Register the model-status routes. `mayListModels` says whether a request may be told the served names (false for a
 * caller without the API key when one is set: the readiness route is open to probes, the model list is not).
 */
export function registerConfigRoutes(app: FastifyInstance, models: ModelSet, log: Logger, mayListModels: (req: FastifyRequest) => boolean, reload?: () => Promise<ModelSpec[]>): void {
  app.get("/v1/config", async () => configStatus(models));
  app.get("/v2/models/*", async (req, reply) => {
    // `{name}/ready` with names that may hold slashes ("org/model"): the wildcard ends in "/ready". Any other path
    // under /v2/models/ is not a route (KServe's model metadata is not served), whether or not it names a model.
    const rest = (req.params as { "*": string })["*"];
    if (!rest.endsWith("/ready")) return reply.status(404).send(toErrorBody(routeNotFound(req.method, req.url)));
    const name = decodeURIComponent(rest.slice(0, -"/ready".length));
    const unit = models.lookup(name);
    if (!unit) return reply.status(404).send(toErrorBody(modelNotFound(name, mayListModels(req) ? models.names() : undefined)));
    if (unit.isReady(models)) return reply.status(200).send();
    return reply.status(503).send(toErrorBody(unit.unavailable(models)));
  });
  app.post("/v1/config/reload", async (_req, reply) => {
    if (!reload) throw noConfigFile();
    // A draining server starts no engine.
    if (models.stopping !== null) throw shuttingDown();
    let specs: ModelSpec[];
    try {
      specs = await reload();
    } catch (err) {
      log.warn({ event: "config_reload_refused", reason: (err as Error).message }, "configuration reload refused");
      throw invalidConfig((err as Error).message);
    }
    const summary = await models.apply(specs);
    const changed = summary.added.length + summary.removed.length + summary.replaced.length > 0;
    // As OVMS: 201 when the reload changed something, 200 when the configuration was the same.
    return reply.status(changed ? 201 : 200).send(configStatus(models));
  });
}

/**
 * `GET …/models` and `GET …/models/{id}`: the one served model as an OpenAI model object; any other id is a 404
 * `model_not_found` (OpenAI's answer; OVMS answers 500 there).
 */
import type { FastifyRequest } from "fastify";
import { modelNotFound } from "../errors.js";
import type { RouteContext } from "../route-context.js";

function modelObject(ctx: RouteContext) {
  return { id: ctx.modelName, object: "model", created: ctx.modelCreated, owned_by: "keel" };
}

export function listModels(ctx: RouteContext): unknown {
  return { object: "list", data: [modelObject(ctx)] };
}

export function getModel(ctx: RouteContext, req: FastifyRequest): unknown {
  // A wildcard, so ids with slashes ("org/model") match too.
  const id = decodeURIComponent((req.params as { "*": string })["*"]);
  if (id !== ctx.modelName) throw modelNotFound(id);
  return modelObject(ctx);
}

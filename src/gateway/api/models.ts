/**
 * `GET …/models` and `GET …/models/{id}`: every served model as an OpenAI model object; any other id is a 404
 * `model_not_found` naming the served models (OpenAI's answer; OVMS answers 500 there).
 */
import type { FastifyRequest } from "fastify";
import { modelNotFound } from "../http/errors.js";
import type { RouteContext } from "../http/route-context.js";

function modelObject(ctx: RouteContext, id: string) {
  return { id, object: "model", created: ctx.model.created, owned_by: "keel" };
}

export function listModels(ctx: RouteContext): unknown {
  return { object: "list", data: ctx.model.served().map((id) => modelObject(ctx, id)) };
}

export function getModel(ctx: RouteContext, req: FastifyRequest): unknown {
  // A wildcard, so ids with slashes ("org/model") match too.
  const id = decodeURIComponent((req.params as { "*": string })["*"]);
  const served = ctx.model.served();
  if (!served.includes(id)) throw modelNotFound(id, served);
  return modelObject(ctx, id);
}

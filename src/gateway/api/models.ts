/**
 * `GET …/models` and `GET …/models/{id}`: every served model as an OpenAI model object; any other id is a 404
 * `model_not_found` naming the served models (OpenAI's answer; OVMS answers 500 there).
 */
import type { FastifyRequest } from "fastify";
import { modelNotFound } from "../http/errors.js";
import { answersTo, type RouteContext } from "../http/route-context.js";

function modelObject(ctx: RouteContext, id: string) {
  return { id, object: "model", created: ctx.model.created, owned_by: "keel" };
}

export function listModels(ctx: RouteContext): unknown {
  return { object: "list", data: ctx.model.served().map((id) => modelObject(ctx, id)) };
}

/** The id of `GET …/models/{id}` (a wildcard, so ids with slashes, "org/model", match too). */
export function modelIdOf(req: FastifyRequest): string {
  return decodeURIComponent((req.params as { "*": string })["*"]);
}

/** `GET …/models/{id}` on the context of the model `id` names (the router looks aliases up too). */
export function getModel(ctx: RouteContext, req: FastifyRequest): unknown {
  const id = modelIdOf(req);
  // A served name as itself; an alias answers with the model it names (aliases are not listed, so ids stay unique).
  const served = ctx.model.served();
  if (served.includes(id)) return modelObject(ctx, id);
  if (answersTo(ctx.model, id)) return modelObject(ctx, ctx.model.name);
  throw modelNotFound(id, served);
}

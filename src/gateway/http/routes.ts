/**
 * Every API route, registered in one place under each prefix Keel serves (`/v3`, `/v3/v1`, `/v1`: OVMS's paths and
 * OpenAI's), and which methods a known path allows (the 405's `Allow`). Routes only validate, admit and encode; the generation
 * pipeline is src/gateway/requests/generate.ts.
 */
import type { FastifyInstance } from "fastify";
import { handleChat } from "../api/chat.js";
import { handleCompletion } from "../api/completions.js";
import { handleCountTokens, handleMessages } from "../api/messages.js";
import { getModel, listModels, modelIdOf } from "../api/models.js";
import { handleResponses } from "../api/responses.js";
import { handleTokenize } from "../api/tokenize.js";
import type { RouteContext } from "./route-context.js";

/** Picks the route context of the model a request body names (model-set.ts). */
export interface ModelRouter {
  /** The named model's context, or the default model's when the body names no served model (its handler answers 404). */
  contextFor(body: unknown): RouteContext;
}

/** API prefixes; each API route exists under all of them. */
export const API_PREFIXES = ["/v3", "/v3/v1", "/v1"] as const;

/** The routes outside the API prefixes (registered by the server). */
export const SERVER_ROUTES = ["GET /health", "GET /v2/health/live", "GET /v2/health/ready", "GET /v2/models/{name}/ready", "GET /v1/config", "POST /v1/config/reload", "GET /metrics"] as const;

/** Method and path (after the prefix) of every API route. */
const API_ROUTES = [
  ["POST", "/chat/completions"],
  ["POST", "/completions"],
  ["POST", "/responses"],
  ["POST", "/messages"],
  ["POST", "/messages/count_tokens"],
  ["POST", "/tokenize"],
  ["GET", "/models"],
  ["GET", "/models/{id}"],
] as const;

/** True for the Anthropic Messages routes (`…/messages`, `…/messages/count_tokens`): their errors use Anthropic's envelope. */
export function isAnthropicRoute(url: string): boolean {
  const path = url.split("?", 1)[0] ?? "";
  return API_PREFIXES.some((p) => path === `${p}/messages` || path === `${p}/messages/count_tokens`);
}

/** Every route as [method, a matcher of its paths]: `{name}` is one path segment, `{id}` (a model id) may hold `/`. */
const ROUTE_MATCHERS: readonly (readonly [string, RegExp])[] = [
  ...API_ROUTES.flatMap(([method, path]) => API_PREFIXES.map((p) => [method, p + path] as const)),
  ...SERVER_ROUTES.map((r) => r.split(" ") as [string, string]),
].map(([method, path]) => [method, new RegExp(`^${path.replace(/\{id\}/g, ".+").replace(/\{\w+\}/g, "[^/]+")}$`)] as const);

/**
 * The methods a path is served with (for a 405's `Allow`), in a fixed order; [] for a path no route has. A GET route
 * answers HEAD too (fastify serves HEAD for every GET route).
 */
export function allowedMethods(url: string): string[] {
  const path = url.split("?", 1)[0] ?? "";
  const methods = new Set(ROUTE_MATCHERS.filter(([, re]) => re.test(path)).map(([m]) => m));
  if (methods.has("GET")) methods.add("HEAD");
  return ["GET", "HEAD", "POST"].filter((m) => methods.has(m));
}

/** Register every API route on `app`. */
export function registerRoutes(app: FastifyInstance, models: ModelRouter): void {
  // Each request goes to the context (engine, registry, limits) of the model its body names.
  const ctx = (body: unknown): RouteContext => models.contextFor(body);
  for (const prefix of API_PREFIXES) {
    app.post(`${prefix}/chat/completions`, (req, reply) => handleChat(ctx(req.body), req, reply));
    app.post(`${prefix}/completions`, (req, reply) => handleCompletion(ctx(req.body), req, reply));
    app.post(`${prefix}/responses`, (req, reply) => handleResponses(ctx(req.body), req, reply));
    app.post(`${prefix}/messages`, (req, reply) => handleMessages(ctx(req.body), req, reply));
    app.post(`${prefix}/messages/count_tokens`, (req, reply) => handleCountTokens(ctx(req.body), req, reply));
    app.post(`${prefix}/tokenize`, (req, reply) => handleTokenize(ctx(req.body), req, reply));
    app.get(`${prefix}/models`, async () => listModels(ctx(undefined)));
    app.get(`${prefix}/models/*`, async (req) => getModel(ctx({ model: modelIdOf(req) }), req));
  }
}

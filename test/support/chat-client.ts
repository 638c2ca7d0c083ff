/**
 * Test support: a raw HTTP chat-completions client that can hard-close its socket at any moment — FIN
 * (`socket.destroy()`) or RST (`socket.resetAndDestroy()`) — the way the seed's reproducer does.
 */
import http from "node:http";
import type { Socket } from "node:net";

/** How the client leaves. */
export type CloseMode = "fin" | "rst";

/** Control handed to event callbacks. */
export interface ClientControl {
  close(mode: CloseMode): void;
}

/** Result of one chat request. */
export interface ChatResult {
  status: number;
  /** Parsed `data:` events (JSON objects), in order; `[DONE]` is not included. */
  events: Record<string, unknown>[];
  /** Concatenated `delta.content` (stream) or `message.content` (unary). */
  text: string;
  /** True when the stream ended with `data: [DONE]`. */
  done: boolean;
  /** finish_reason of the final chunk / choice. */
  finishReason: string | null;
  /** True when this client closed the socket itself. */
  closedByClient: boolean;
  /** Unary or error body. */
  body: unknown;
}

export interface ChatOptions {
  /** Called after each parsed SSE event with its 0-based index. */
  onEvent?(event: Record<string, unknown>, index: number, ctl: ClientControl): void;
  /** Called once the request is written (before any response). */
  onSent?(ctl: ClientControl): void;
  /** Called when response headers arrive. */
  onHeaders?(ctl: ClientControl): void;
}

/** POST a chat completion to `baseUrl + path` and collect the response. */
export function chat(baseUrl: string, body: Record<string, unknown>, opts: ChatOptions = {}, path = "/v3/chat/completions"): Promise<ChatResult> {
  return new Promise((resolve, reject) => {
    const result: ChatResult = { status: 0, events: [], text: "", done: false, finishReason: null, closedByClient: false, body: null };
    let socket: Socket | null = null;
    let settled = false;
    const settle = (): void => {
      if (!settled) {
        settled = true;
        resolve(result);
      }
    };
    const ctl: ClientControl = {
      close(mode) {
        if (result.closedByClient || !socket) return;
        result.closedByClient = true;
        if (mode === "rst") socket.resetAndDestroy();
        else socket.destroy();
        settle();
      },
    };
    const payload = JSON.stringify(body);
    const req = http.request(baseUrl + path, { method: "POST", headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) }, agent: false });
    req.on("socket", (s) => {
      socket = s;
    });
    req.on("error", (err) => {
      if (result.closedByClient) settle();
      else reject(err);
    });
    req.on("response", (res) => {
      result.status = res.statusCode ?? 0;
      opts.onHeaders?.(ctl);
      const streaming = (res.headers["content-type"] ?? "").startsWith("text/event-stream");
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => {
        if (result.closedByClient) return;
        buf += d;
        if (!streaming) return;
        let i: number;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const raw = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!raw.startsWith("data: ")) continue;
          const data = raw.slice(6);
          if (data === "[DONE]") {
            result.done = true;
            continue;
          }
          const ev = JSON.parse(data) as Record<string, unknown>;
          result.events.push(ev);
          const choice = (ev["choices"] as { delta?: { content?: string }; finish_reason?: string | null }[] | undefined)?.[0];
          if (choice?.delta?.content) result.text += choice.delta.content;
          if (choice?.finish_reason) result.finishReason = choice.finish_reason;
          opts.onEvent?.(ev, result.events.length - 1, ctl);
          if (result.closedByClient) return;
        }
      });
      res.on("end", () => {
        if (!streaming && buf) {
          result.body = JSON.parse(buf);
          const choice = (result.body as { choices?: { message?: { content?: string }; finish_reason?: string }[] }).choices?.[0];
          if (choice) {
            result.text = choice.message?.content ?? "";
            result.finishReason = choice.finish_reason ?? null;
          }
        }
        settle();
      });
      res.on("error", () => settle());
      res.on("close", () => settle());
    });
    req.end(payload, () => opts.onSent?.(ctl));
  });
}

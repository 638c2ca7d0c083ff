/**
 * A small English training corpus for the tiny model's BPE merges. Written for Keel; it only has to contain
 * enough varied, everyday text (prose, numbers, JSON, code-like lines, chat roles) for a few hundred merges.
 * Changing this text changes the vocabulary, and therefore every generated model: bump
 * `TINY_MODEL_GENERATOR_VERSION` in tiny-model.ts when you edit it.
 */
export const TRAINING_CORPUS: string = `
Keel is an inference server. A client opens a connection, sends a request with a prompt, and waits for the
answer to stream back one token at a time. The gateway checks the request, counts its tokens, and puts it in
a queue. When a slot becomes free, the scheduler moves the oldest request from the queue into the engine. The
engine runs one step at a time: every step decodes a single token for each running request, and it also reads
part of the prompt of a new request, as long as the step stays inside its token budget.

If the client goes away before the answer is finished, the request is cancelled. Its slot is released at the
end of the current step, and the other requests carry on as if nothing had happened. A request can also stop
because it produced the end of text, because it reached its maximum number of tokens, or because a stop string
appeared in the output. The server reports the reason in the final message, together with the usage numbers:
prompt tokens, completion tokens, and total tokens.

Requests wait in the queue for a short time when the server is busy. When the queue is full, new requests are
rejected at once with a clear error, and the client may try again later. A health check tells the load balancer
whether the server is ready. Metrics count requests, errors, tokens per second, queue time, and the time to the
first token. Logs record what happened to every request, from the moment it arrived until the moment it ended.

The weather this week has been strange. On Monday it rained all day, and the streets were full of umbrellas. On
Tuesday the wind came from the north and the air was sharp and cold. By Wednesday the clouds had gone, the sky
was clear, and the temperature rose to twenty degrees in the afternoon. Thursday brought fog in the morning and
thunder in the evening. Nobody knows what Friday will bring, but the forecast says sun, with a light breeze
from the west and a small chance of showers near the coast.

There was once an old lighthouse keeper who lived alone on a rocky island. Every evening he climbed the long
stairs, lit the great lamp, and watched the ships pass in the dark. One winter night a storm broke the lamp,
and the keeper worked until dawn to repair it with his cold hands. When the light shone again, a small boat
found its way into the harbour, and the sailors waved to him from the deck. After that night, the people of
the town brought him bread, apples, and letters, and he was never quite so lonely again.

A young girl found a map in her grandmother's attic. The paper was yellow and soft, and the ink had faded, but
she could still read the names of rivers, villages, and hills. She followed the map through the forest, over a
wooden bridge, and up to an old stone wall. Behind the wall there was no treasure, only a garden full of wild
flowers and a bench where someone had carved two names long ago. She sat there for a while, and then she went
home to ask her grandmother about the names.

Numbers and units: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 32, 64, 100, 128, 256, 512, 1000, 1024, 2048, 4096.
A second has 1000 milliseconds, and a millisecond has 1000 microseconds. A kilobyte is 1024 bytes, a megabyte
is 1024 kilobytes, and a gigabyte is 1024 megabytes. The model has 4 layers, 4 heads, and a context of 2048
tokens. The server handled 250 requests per minute at a median latency of 35 milliseconds.

{"model": "keel-tiny", "messages": [{"role": "system", "content": "You are a helpful assistant."}]}
{"role": "user", "content": "What is the weather like today?"}
{"role": "assistant", "content": "It is sunny and warm, with a light wind from the west."}
{"id": "req-42", "object": "chat.completion", "created": 1767225600, "choices": [{"index": 0}]}
{"usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}, "finish_reason": "stop"}
{"type": "object", "properties": {"name": {"type": "string"}, "count": {"type": "integer"}}, "required": []}

const queue = new Queue({ capacity: 64, timeoutMs: 30000 });
async function handle(request, reply) { const result = await engine.submit(request); return reply.send(result); }
if (signal.aborted) { return { status: "cancelled", reason: signal.reason }; }
for (const item of items) { total += item.tokens.length; }
export function clamp(value, min, max) { return Math.min(max, Math.max(min, value)); }
let count = 0; while (count < 10) { count = count + 1; console.log("step", count); }
throw new Error("queue is full: try again later");

Questions and answers. Where is the station? The station is at the end of the main street, next to the old
market. How long does the train take? The train takes about forty minutes. What time is it now? It is half past
seven in the evening. Who wrote this letter? My brother wrote it when he was living by the sea. Why is the sky
blue? Sunlight is scattered by the air, and blue light is scattered the most. Can you help me? Yes, of course,
tell me what you need and I will do my best to help you.

The user writes a message and the assistant writes a reply. The system message tells the assistant how to
behave, for example to be brief, to be polite, or to answer only in JSON. A chat template joins the messages
into one text before it is turned into tokens, and special tokens mark where each message starts and ends.
`;

/** Distinct user prompts shared by the end-to-end suites (greedy controls are computed per suite). */
export const PROMPTS = [
  "Tell me about the queue in front of the server.",
  "What does the weather look like in the morning by the river?",
  "Write a short story about a fox at the edge of the forest.",
  "List three reasons why a request might be cancelled.",
  "Explain how memory is measured in bytes and kilobytes.",
  "Describe prefill and decode in one paragraph.",
  "What is a KV cache and why is it bounded?",
  "Write one line of JSON about a city.",
];

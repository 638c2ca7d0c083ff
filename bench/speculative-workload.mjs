// The agent-like workload of bench/speculative.mjs: (a) an ~80-line source file in the prompt, returned whole with
// one small change; (b) a tool result (long JSON) quoted back. Deterministic: the same messages every run.

/** An ~80-line TypeScript module (a small inventory store), the file the "edit" workload asks to return changed. */
const SOURCE = `import { readFile, writeFile } from "node:fs/promises";

export interface Item {
  id: string;
  name: string;
  quantity: number;
  priceCents: number;
  tags: string[];
}

export class Inventory {
  private readonly items = new Map<string, Item>();

  constructor(private readonly path: string) {}

  async load(): Promise<void> {
    const text = await readFile(this.path, "utf8");
    const list = JSON.parse(text) as Item[];
    this.items.clear();
    for (const item of list) this.items.set(item.id, item);
  }

  async save(): Promise<void> {
    const list = [...this.items.values()].sort((a, b) => a.id.localeCompare(b.id));
    await writeFile(this.path, JSON.stringify(list, null, 2));
  }

  add(item: Item): void {
    if (this.items.has(item.id)) throw new Error(\`duplicate item \${item.id}\`);
    if (item.quantity < 0) throw new Error(\`negative quantity for \${item.id}\`);
    this.items.set(item.id, { ...item, tags: [...item.tags] });
  }

  remove(id: string): boolean {
    return this.items.delete(id);
  }

  restock(id: string, amount: number): Item {
    const item = this.items.get(id);
    if (!item) throw new Error(\`unknown item \${id}\`);
    if (amount <= 0) throw new Error("amount must be positive");
    item.quantity += amount;
    return item;
  }

  sell(id: string, amount: number): number {
    const item = this.items.get(id);
    if (!item) throw new Error(\`unknown item \${id}\`);
    if (amount > item.quantity) throw new Error(\`only \${item.quantity} left of \${id}\`);
    item.quantity -= amount;
    return amount * item.priceCents;
  }

  findByTag(tag: string): Item[] {
    return [...this.items.values()].filter((item) => item.tags.includes(tag));
  }

  totalValueCents(): number {
    let total = 0;
    for (const item of this.items.values()) total += item.quantity * item.priceCents;
    return total;
  }

  lowStock(threshold = 5): Item[] {
    return [...this.items.values()]
      .filter((item) => item.quantity <= threshold)
      .sort((a, b) => a.quantity - b.quantity);
  }
}

export function formatPrice(cents: number): string {
  const whole = Math.floor(cents / 100);
  const rest = String(cents % 100).padStart(2, "0");
  return \`$\${whole}.\${rest}\`;
}
`;

/** "Edit this file": return it whole with one function renamed. */
export const EDIT_FILE_MESSAGES = [
  { role: "system", content: "You are a careful coding assistant. When asked to edit a file, reply with the complete edited file in one code block and nothing else." },
  { role: "user", content: `Here is src/inventory.ts:\n\n\`\`\`ts\n${SOURCE}\`\`\`\n\nRename the method lowStock to itemsRunningLow. Return the whole file.` },
];

const ORDERS = Array.from({ length: 14 }, (_, i) => ({
  order_id: `ORD-${(48213 + i * 37).toString()}`,
  customer: ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth", "Frances Allen"][i % 7],
  status: ["shipped", "pending", "delivered", "cancelled"][i % 4],
  total: Math.round((19.99 + i * 13.57) * 100) / 100,
  items: 1 + (i % 4),
}));

/** "Tool result quoted back": a tool call's JSON result that the answer must list again. */
export const TOOL_RESULT_MESSAGES = [
  { role: "system", content: "You are an order-support assistant. Answer only from tool results." },
  { role: "user", content: "List every order of the last week: its id, customer, status and total, one per line." },
  { role: "assistant", content: "", tool_calls: [{ id: "call_1", type: "function", function: { name: "list_orders", arguments: JSON.stringify({ days: 7 }) } }] },
  { role: "tool", tool_call_id: "call_1", content: JSON.stringify({ orders: ORDERS }, null, 1) },
];

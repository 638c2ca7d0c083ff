/**
 * `keel make-model`: writes a tiny random-weight GGUF (see tiny-model.ts). Importing this module has no side
 * effects; the CLI entry point calls {@link main}.
 *
 * ```
 * keel make-model --out x.gguf [--layers N] [--hidden N] [--ff N] [--heads N] [--kv-heads N] [--ctx N]
 *                 [--merges N] [--seed N] [--logit-scale X] [--f16] [--chat-template-file t.jinja]
 *                 [--broken zero-layers|kv-heads-3|expert-used]
 * ```
 */
import {readFileSync, writeFileSync} from "node:fs";
import {buildTinyModel, tinyModelSpecialIds, resolveTinyModelOptions, type BrokenModelKind, type TinyModelOptions} from "./tiny-model.js";

/** Usage text of the `make-model` command. */
export const MAKE_MODEL_USAGE = `usage: keel make-model --out FILE.gguf [options]
  --layers N  --hidden N  --ff N  --heads N  --kv-heads N  --ctx N  --merges N  --seed N
  --logit-scale X          std of the output logits (default from TINY_MODEL_DEFAULTS)
  --f16                    store matrices as F16
  --chat-template-file F   Jinja chat template (default ChatML)
  --broken KIND            zero-layers | kv-heads-3 | expert-used (crafted models that abort llama.cpp)`;

/** Parsed command line of `make-model`. */
export interface MakeModelArgs {
    out: string;
    options: TinyModelOptions;
}

const INT_FLAGS = {
    "--layers": "layers", "--hidden": "hidden", "--ff": "ff", "--heads": "heads", "--kv-heads": "kvHeads",
    "--ctx": "ctx", "--merges": "merges", "--seed": "seed"
} as const;

/**
 * Parses `make-model` arguments (without the command name).
 * @throws Error with a message for the user on unknown flags, missing values, bad numbers or a missing --out
 */
export function parseMakeModelArgs(argv: readonly string[]): MakeModelArgs {
    const options: TinyModelOptions = {};
    let out: string | undefined;
    for (let i = 0; i < argv.length; i++) {
        const flag = argv[i]!;
        const value = (): string => {
            const v = argv[++i];
            if (v === undefined) throw new Error(`${flag} needs a value`);
            return v;
        };
        if (flag === "--out" || flag === "-o") out = value();
        else if (flag === "--f16") options.f16 = true;
        else if (flag === "--broken") options.broken = value() as BrokenModelKind;
        else if (flag === "--chat-template-file") options.chatTemplate = readFileSync(value(), "utf8");
        else if (flag === "--logit-scale") {
            const v = Number(value());
            if (!Number.isFinite(v)) throw new Error(`${flag}: not a number`);
            options.logitScale = v;
        } else if (flag in INT_FLAGS) {
            const raw = value();
            const v = Number(raw);
            if (!Number.isInteger(v)) throw new Error(`${flag}: "${raw}" is not an integer`);
            options[INT_FLAGS[flag as keyof typeof INT_FLAGS]] = v;
        } else throw new Error(`unknown option ${flag}`);
    }
    if (out === undefined) throw new Error("--out is required");
    resolveTinyModelOptions(options); // validate early, with the same messages as the builder
    return {out, options};
}

/**
 * Runs `make-model`: builds the model, writes it to `--out` and prints a one-line JSON summary to stdout.
 * @param argv arguments after `make-model`
 * @returns the process exit code (0 ok, 1 build/write failure, 2 usage error); errors go to stderr, never thrown
 */
export function main(argv: readonly string[]): number {
    if (argv.includes("--help") || argv.includes("-h")) {
        process.stdout.write(MAKE_MODEL_USAGE + "\n");
        return 0;
    }
    let args: MakeModelArgs;
    try {
        args = parseMakeModelArgs(argv);
    } catch (err) {
        process.stderr.write(`keel make-model: ${(err as Error).message}\n${MAKE_MODEL_USAGE}\n`);
        return 2;
    }
    try {
        const buf = buildTinyModel(args.options);
        writeFileSync(args.out, buf);
        const ids = tinyModelSpecialIds(args.options);
        process.stdout.write(JSON.stringify({out: args.out, bytes: buf.length, ...ids, options: resolveTinyModelOptions(args.options)},
            (k, v: unknown) => (k === "chatTemplate" ? undefined : v)) + "\n");
        return 0;
    } catch (err) {
        process.stderr.write(`keel make-model: ${(err as Error).message}\n`);
        return 1;
    }
}

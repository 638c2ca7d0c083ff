/**
 * `keel make-model`: writes a tiny random-weight GGUF (see tiny-model.ts). Importing this module has no side
 * effects; the CLI entry point calls {@link main}.
 *
 * ```
 * keel make-model --out x.gguf [--shape qwen2.5-0.5b|llama3-8b] [--layers N] [--hidden N] [--ff N] [--heads N]
 *                 [--kv-heads N] [--ctx N] [--merges N] [--vocab N] [--seed N] [--logit-scale X] [--f16] [--chat-template-file t.jinja]
 *                 [--broken zero-layers|kv-heads-3|expert-used] [--agent qwen3|qwen3coder] [--user-token T]...
 * keel make-model --out x.gguf --arch mamba|jamba [--layers N] [--hidden N] [--state-size N] [--conv-kernel N]
 *                 [--dt-rank N] [--heads N] [--kv-heads N] [--ff N] [--attention-layers 1,3] [--ctx N] [--merges N]
 *                 [--seed N] [--logit-scale X] [--chat-template-file t.jinja]
 * ```
 * `--arch mamba|jamba` writes a model with recurrent state (tiny-recurrent-model.ts, docs/recurrent-model.md).
 * The file is streamed to a temporary name and renamed into place (`writeGgufFile`): any size, never a partial file.
 */
import {readFileSync} from "node:fs";
import {writeGgufFile} from "./gguf-writer.js";
import {AGENT_TAGS, QWEN3_STYLE_TEMPLATE, QWEN3CODER_STYLE_TEMPLATE} from "./agent-templates.js";
import {
    MODEL_SHAPES, tinyModelSpecialIds, tinyModelWriter, resolveTinyModelOptions, type BrokenModelKind, type ModelShapeName,
    type TinyModelOptions
} from "./tiny-model.js";
import {
    buildTinyRecurrentModel, resolveTinyRecurrentModelOptions, tinyRecurrentModelSpecialIds, type TinyRecurrentArch,
    type TinyRecurrentModelOptions
} from "./tiny-recurrent-model.js";

/** Usage text of the `make-model` command. */
export const MAKE_MODEL_USAGE = `usage: keel make-model --out FILE.gguf [options]
       keel make-model --hybrid-ir   the tiny hybrid (linear-attention) OpenVINO IR, made once into Keel's cache;
                                     prints its folder (for --engine openvino --model_path)
  --layers N  --hidden N  --ff N  --heads N  --kv-heads N  --ctx N  --merges N  --seed N
  --vocab N                total vocabulary size: corpus merges plus generated word-like ones (e.g. 151936)
  --shape NAME             ${Object.keys(MODEL_SHAPES).join(" | ")}: that model's sizes and vocabulary
                           (flags after it override single sizes)
  --logit-scale X          std of the output logits (default from TINY_MODEL_DEFAULTS)
  --f16                    store matrices as F16
  --chat-template-file F   Jinja chat template (default ChatML)
  --broken KIND            zero-layers | kv-heads-3 | expert-used (crafted models that abort llama.cpp)
  --agent FAMILY           qwen3 | qwen3coder: that family's style of template (tool calls, thinking) and its
                           tags as single tokens (the keel-tiny-qwen3 / keel-tiny-qwen3coder models)
  --user-token T           add T as a USER_DEFINED token (repeatable)
  --arch ARCH              llama (default) | mamba | jamba (recurrent-state models; no --f16 / --broken)
  --state-size N  --conv-kernel N  --dt-rank N          SSM sizes (mamba / jamba only)
  --attention-layers I,J   jamba: indices of the attention layers (default 1)`;

/** Parsed command line of `make-model`. */
export interface MakeModelArgs {
    out: string;
    /** Llama options (`--arch llama`, the default); unused when {@link recurrent} is set. */
    options: TinyModelOptions;
    /** Set for `--arch mamba|jamba`: the recurrent model's options (the shared flags are copied here). */
    recurrent?: TinyRecurrentModelOptions;
}

const INT_FLAGS = {
    "--layers": "layers", "--hidden": "hidden", "--ff": "ff", "--heads": "heads", "--kv-heads": "kvHeads",
    "--ctx": "ctx", "--merges": "merges", "--seed": "seed", "--vocab": "vocab"
} as const;

const RECURRENT_INT_FLAGS = {"--state-size": "stateSize", "--conv-kernel": "convKernel", "--dt-rank": "dtRank"} as const;

/**
 * Parses `make-model` arguments (without the command name).
 * @throws Error with a message for the user on unknown flags, missing values, bad numbers or a missing --out
 */
export function parseMakeModelArgs(argv: readonly string[]): MakeModelArgs {
    const options: TinyModelOptions = {};
    const recurrentOnly: TinyRecurrentModelOptions = {};
    let arch: "llama" | TinyRecurrentArch = "llama";
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
        else if (flag === "--shape") {
            const name = value();
            if (!Object.hasOwn(MODEL_SHAPES, name)) throw new Error(`--shape: unknown shape "${name}" (${Object.keys(MODEL_SHAPES).join(" | ")})`);
            Object.assign(options, MODEL_SHAPES[name as ModelShapeName]);
        }
        else if (flag === "--arch") {
            const a = value();
            if (a !== "llama" && a !== "mamba" && a !== "jamba") throw new Error(`--arch: unknown architecture "${a}" (llama | mamba | jamba)`);
            arch = a;
        } else if (flag === "--attention-layers") {
            const raw = value();
            const list = raw.split(",").map((x) => Number(x.trim()));
            if (raw.trim() === "" || list.some((v) => !Number.isInteger(v))) throw new Error(`${flag}: "${raw}" is not a comma-separated list of integers`);
            recurrentOnly.attentionLayers = list;
        } else if (flag in RECURRENT_INT_FLAGS) {
            const raw = value();
            const v = Number(raw);
            if (!Number.isInteger(v)) throw new Error(`${flag}: "${raw}" is not an integer`);
            recurrentOnly[RECURRENT_INT_FLAGS[flag as keyof typeof RECURRENT_INT_FLAGS]] = v;
        }
        else if (flag === "--broken") options.broken = value() as BrokenModelKind;
        else if (flag === "--agent") {
            const family = value();
            if (family !== "qwen3" && family !== "qwen3coder") throw new Error(`--agent: unknown family "${family}" (qwen3 | qwen3coder)`);
            options.chatTemplate = family === "qwen3" ? QWEN3_STYLE_TEMPLATE : QWEN3CODER_STYLE_TEMPLATE;
            options.userTokens = [...new Set([...(options.userTokens ?? []), ...AGENT_TAGS])];
        } else if (flag === "--user-token") options.userTokens = [...(options.userTokens ?? []), value()];
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
    if (arch !== "llama") {
        if (options.f16 || options.broken !== undefined || options.userTokens !== undefined || options.vocab !== undefined) {
            throw new Error(`--f16, --broken, --agent, --user-token, --vocab and --shape are not supported with --arch ${arch}`);
        }
        const {f16: _f16, broken: _broken, userTokens: _userTokens, vocab: _vocab, ...shared} = options;
        const recurrent: TinyRecurrentModelOptions = {arch, ...shared, ...recurrentOnly};
        resolveTinyRecurrentModelOptions(recurrent);
        return {out, options, recurrent};
    }
    if (Object.keys(recurrentOnly).length > 0) throw new Error("--state-size, --conv-kernel, --dt-rank and --attention-layers need --arch mamba|jamba");
    resolveTinyModelOptions(options); // validate early, with the same messages as the builder
    if (options.vocab !== undefined) tinyModelSpecialIds(options); // a vocabulary below what the corpus gives is a usage error (memoized for the build)
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
        if (args.recurrent) {
            const bytes = writeGgufFile(args.out, buildTinyRecurrentModel(args.recurrent));
            const ids = tinyRecurrentModelSpecialIds(args.recurrent);
            process.stdout.write(JSON.stringify({out: args.out, bytes, ...ids, options: resolveTinyRecurrentModelOptions(args.recurrent)},
                (k, v: unknown) => (k === "chatTemplate" ? undefined : v)) + "\n");
            return 0;
        }
        const bytes = writeGgufFile(args.out, tinyModelWriter(args.options));
        const ids = tinyModelSpecialIds(args.options);
        process.stdout.write(JSON.stringify({out: args.out, bytes, ...ids, options: resolveTinyModelOptions(args.options)},
            (k, v: unknown) => (k === "chatTemplate" ? undefined : v)) + "\n");
        return 0;
    } catch (err) {
        process.stderr.write(`keel make-model: ${(err as Error).message}\n`);
        return 1;
    }
}

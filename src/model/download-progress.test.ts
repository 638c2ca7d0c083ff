import {describe, expect, it} from "vitest";
import {formatBytes, formatDuration, formatSpeed, logProgress, progressSink, ttyProgress} from "./download-progress.js";

/** A clock the test moves by hand. */
function clock(start = 1_000_000): {now: () => number; advance: (ms: number) => void} {
    let t = start;
    return {now: () => t, advance: (ms) => void (t += ms)};
}

describe("formatting", () => {
    it("bytes in kB, MB or GB; speed per second", () => {
        expect(formatBytes(0)).toBe("0 kB");
        expect(formatBytes(999_499)).toBe("999 kB");
        expect(formatBytes(98_362_432)).toBe("98.4 MB");
        expect(formatBytes(1_117_320_768)).toBe("1.12 GB");
        expect(formatSpeed(12_345_678)).toBe("12.3 MB/s");
    });

    it("durations rounded up: seconds, minutes and seconds, hours and minutes", () => {
        expect(formatDuration(0)).toBe("0 s");
        expect(formatDuration(4.2)).toBe("5 s");
        expect(formatDuration(59.2)).toBe("1 min 00 s");
        expect(formatDuration(125)).toBe("2 min 05 s");
        expect(formatDuration(3720)).toBe("1 h 02 min");
        expect(formatDuration(-3)).toBe("0 s");
    });
});

describe("log lines (not a terminal)", () => {
    it("one line per 10% step with size, speed and time left; the last says the total and the time it took", () => {
        const c = clock();
        const lines: string[] = [];
        const p = logProgress((l) => lines.push(l), "f.gguf", {now: c.now});
        // 25 kB every 100 ms: 250 kB/s
        for (let b = 0; b <= 1_000_000; b += 25_000) {
            p(b, 1_000_000);
            c.advance(100);
        }
        expect(lines).toHaveLength(11);
        expect(lines[0]).toBe("f.gguf: 0% (0 kB of 1.0 MB)");
        expect(lines[4]).toBe("f.gguf: 40% (400 kB of 1.0 MB, 250 kB/s, ETA 3 s)");
        expect(lines[10]).toBe("f.gguf: 100% (1.0 MB in 4 s, 250 kB/s)");
        expect(lines.map((l) => Number(/: (\d+)%/.exec(l)![1]))).toEqual([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
    });

    it("a jump over several steps is one line; resumed bytes do not count as speed", () => {
        const c = clock();
        const lines: string[] = [];
        const p = logProgress((l) => lines.push(l), "m", {now: c.now});
        p(500_000, 1_000_000); // resumed at half
        c.advance(2000);
        p(700_000, 1_000_000); // 200 kB in 2 s
        c.advance(500);
        p(710_000, 1_000_000); // still 70%: no line
        expect(lines).toEqual(["m: 50% (500 kB of 1.0 MB)", "m: 70% (700 kB of 1.0 MB, 100 kB/s, ETA 3 s)"]);
    });

    it("an unknown total: a line per 100 MB", () => {
        const c = clock();
        const lines: string[] = [];
        const p = logProgress((l) => lines.push(l), "x", {now: c.now});
        for (let b = 0; b <= 250e6; b += 10e6) {
            p(b, null);
            c.advance(1000);
        }
        expect(lines).toEqual(["x: 0 kB downloaded", "x: 100.0 MB downloaded, 10.0 MB/s", "x: 200.0 MB downloaded, 10.0 MB/s"]);
    });
});

describe("a bar (terminal)", () => {
    it("redrawn in place when the percent changes or a second passed, finished with a newline, then silent", () => {
        const c = clock();
        let out = "";
        const p = ttyProgress((s) => (out += s), "f.gguf", {width: 10, now: c.now});
        p(0, 1_000_000);
        c.advance(1000);
        p(500_000, 1_000_000);
        c.advance(100);
        p(500_001, 1_000_000); // same percent within a second: not redrawn
        c.advance(1000);
        p(500_002, 1_000_000); // a second later: redrawn (speed and time left move)
        c.advance(900);
        p(1_000_000, 1_000_000);
        p(1_000_000, 1_000_000); // after the newline: nothing
        const frames = out.split("\r").slice(1);
        expect(frames).toEqual([
            "f.gguf [          ]   0%  0 kB / 1.0 MB\x1b[K",
            "f.gguf [#####     ]  50%  500 kB / 1.0 MB  500 kB/s  ETA 1 s\x1b[K",
            "f.gguf [#####     ]  50%  500 kB / 1.0 MB  238 kB/s  ETA 3 s\x1b[K",
            "f.gguf [##########] 100%  1.0 MB in 3 s\x1b[K\n",
        ]);
    });
});

describe("progressSink", () => {
    it("draws a bar on a terminal and writes log lines elsewhere", () => {
        const tty = {isTTY: true, out: "", write(s: string) { this.out += s; }};
        const ttyLines: string[] = [];
        progressSink(tty, (l) => ttyLines.push(l), "a")(1, 2);
        expect(tty.out.startsWith("\ra [")).toBe(true);
        expect(ttyLines).toEqual([]);
        const pipe = {isTTY: false, out: "", write(s: string) { this.out += s; }};
        const pipeLines: string[] = [];
        progressSink(pipe, (l) => pipeLines.push(l), "a")(1, 2);
        expect(pipe.out).toBe("");
        expect(pipeLines).toEqual(["a: 50% (0 kB of 0 kB)"]);
    });
});

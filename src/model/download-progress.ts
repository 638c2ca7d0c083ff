/**
 * Download progress for model fetches (PyPI wheels, `--source_model` hub pulls): size, speed and time left, as a bar
 * redrawn in place on a terminal, and on anything else (a log file, a container's stdout) one line per 10% so that a
 * log shows the download moving without flooding it.
 *
 * @module
 */

/** Receives the bytes received so far (resumed bytes included) and the expected total (null = unknown). */
export type ProgressSink = (received: number, total: number | null) => void;

/** Bytes in the unit model files are talked about in: kB below 1 MB, MB below 1 GB, else GB with two decimals. */
export function formatBytes(bytes: number): string {
    if (bytes < 1e6) return `${(bytes / 1e3).toFixed(0)} kB`;
    if (bytes < 1e9) return `${(bytes / 1e6).toFixed(1)} MB`;
    return `${(bytes / 1e9).toFixed(2)} GB`;
}

/** A transfer rate, e.g. `12.3 MB/s`. */
export function formatSpeed(bytesPerSecond: number): string {
    return `${formatBytes(bytesPerSecond)}/s`;
}

/** A duration rounded up to whole seconds: `7 s`, `2 min 05 s`, `1 h 02 min`. */
export function formatDuration(seconds: number): string {
    const s = Math.max(0, Math.ceil(seconds));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
    return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

/** Options shared by both sinks. */
export interface ProgressOptions {
    /** Clock in ms (default Date.now); tests inject one. */
    now?: () => number;
}

/** The speed of a download: bytes since its first report over the time since then (resumed bytes are not counted). */
class Rate {
    /** The first report (time and bytes), or null before it. */
    private first: {at: number; bytes: number} | null = null;

    constructor(private readonly now: () => number) {}

    /** Records `received`; returns bytes per second, or null until some time has passed and bytes have moved. */
    observe(received: number): number | null {
        const at = this.now();
        if (this.first === null) {
            this.first = {at, bytes: received};
            return null;
        }
        const seconds = (at - this.first.at) / 1000;
        const bytes = received - this.first.bytes;
        return seconds > 0 && bytes > 0 ? bytes / seconds : null;
    }

    /** Seconds since the first report (0 before it). */
    elapsed(): number {
        return this.first === null ? 0 : (this.now() - this.first.at) / 1000;
    }
}

/** `12.1 MB/s, ETA 5 s` (or less when the speed or the total is not known yet). */
function speedAndEta(received: number, total: number | null, speed: number | null): string[] {
    if (speed === null) return [];
    const parts = [formatSpeed(speed)];
    if (total !== null && total > received) parts.push(`ETA ${formatDuration((total - received) / speed)}`);
    return parts;
}

/**
 * A progress sink that writes a bar redrawn in place (`\r`, the rest of the line cleared) to a TTY stream: size,
 * speed and time left. Redrawn when the whole percent changes or a second has passed (so speed and time left keep
 * moving on a slow download); finished with a newline when the total is reached.
 * @param write where the bar goes (e.g. `s => process.stderr.write(s)`)
 * @param label shown before the bar (the file or model name)
 */
export function ttyProgress(write: (s: string) => void, label: string, opts: ProgressOptions & {width?: number} = {}): ProgressSink {
    const width = opts.width ?? 30;
    const rate = new Rate(opts.now ?? Date.now);
    const now = opts.now ?? Date.now;
    /** Last drawn whole percent and when, so that the bar is redrawn only when it changes or a second passed. */
    let last = {percent: -1, at: -Infinity};
    /** Set once 100% was drawn: nothing is drawn after the final newline. */
    let done = false;
    return (received, total) => {
        const speed = rate.observe(received);
        if (done) return;
        const at = now();
        if (total === null || total === 0) {
            if (at - last.at < 1000) return;
            last = {percent: -1, at};
            write(`\r${label} ${[formatBytes(received), ...speedAndEta(received, null, speed)].join("  ")}\x1b[K`);
            return;
        }
        const percent = Math.min(100, Math.floor((received / total) * 100));
        if (percent === last.percent && at - last.at < 1000) return;
        last = {percent, at};
        done = percent === 100;
        const filled = Math.round((percent / 100) * width);
        const bar = `[${"#".repeat(filled)}${" ".repeat(width - filled)}]`;
        const tail = done ? [`${formatBytes(total)} in ${formatDuration(rate.elapsed())}`] : [`${formatBytes(received)} / ${formatBytes(total)}`, ...speedAndEta(received, total, speed)];
        write(`\r${label} ${bar} ${String(percent).padStart(3)}%  ${tail.join("  ")}\x1b[K${done ? "\n" : ""}`);
    };
}

/**
 * A progress sink that emits one log line each time the download crosses another 10% (and at 100%), with size,
 * speed and time left; with an unknown total, one line per 100 MB.
 */
export function logProgress(log: (line: string) => void, label: string, opts: ProgressOptions = {}): ProgressSink {
    const rate = new Rate(opts.now ?? Date.now);
    /** The last tenth (0..10) reported, or for an unknown total the last 100 MB step. */
    let lastStep = -1;
    return (received, total) => {
        const speed = rate.observe(received);
        if (total === null || total === 0) {
            const step = Math.floor(received / 100e6);
            if (step > lastStep) {
                lastStep = step;
                log(`${label}: ${[`${formatBytes(received)} downloaded`, ...speedAndEta(received, null, speed)].join(", ")}`);
            }
            return;
        }
        const step = Math.min(10, Math.floor((received / total) * 10));
        // The first call (resumed or 0 bytes) reports where the download starts.
        if (step <= lastStep) return;
        lastStep = step;
        const detail = step === 10
            ? [`${formatBytes(total)} in ${formatDuration(rate.elapsed())}`, ...(speed !== null ? [formatSpeed(speed)] : [])]
            : [`${formatBytes(received)} of ${formatBytes(total)}`, ...speedAndEta(received, total, speed)];
        log(`${label}: ${step * 10}% (${detail.join(", ")})`);
    };
}

/**
 * The sink for a download shown on `stream`: a bar when it is a terminal, else one log line per 10% through `log`.
 * @param stream where a bar would be drawn (process.stderr)
 * @param log where lines go when it is not a terminal
 */
export function progressSink(stream: {isTTY?: boolean; write(s: string): unknown}, log: (line: string) => void, label: string): ProgressSink {
    return stream.isTTY ? ttyProgress((s) => void stream.write(s), label) : logProgress(log, label);
}

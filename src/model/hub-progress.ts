/**
 * Download progress for `--source_model` pulls: a redrawn bar on a terminal, and on anything else (a log file, a
 * container's stdout) one line per 10% so that a log shows the download moving without flooding it.
 *
 * @module
 */

/** Receives the bytes on disk so far (resumed bytes included) and the expected total (null = unknown). */
export type ProgressSink = (received: number, total: number | null) => void;

/** Formats bytes as MB with one decimal, the unit model files are talked about in. */
function mb(bytes: number): string {
    return `${(bytes / 1e6).toFixed(1)} MB`;
}

/**
 * A progress sink that writes a bar redrawn in place (`\r`) to a TTY stream; the bar is finished with a newline
 * when the total is reached.
 * @param write where the bar goes (e.g. `s => process.stderr.write(s)`)
 * @param label shown before the bar (the file name)
 */
export function ttyProgress(write: (s: string) => void, label: string, width = 30): ProgressSink {
    /** Last drawn whole percent, so that the bar is redrawn only when it changes. */
    let lastPercent = -1;
    return (received, total) => {
        if (total === null || total === 0) {
            write(`\r${label} ${mb(received)}`);
            return;
        }
        const percent = Math.min(100, Math.floor((received / total) * 100));
        if (percent === lastPercent) return;
        lastPercent = percent;
        const filled = Math.round((percent / 100) * width);
        write(`\r${label} [${"#".repeat(filled)}${" ".repeat(width - filled)}] ${String(percent).padStart(3)}% ${mb(received)} / ${mb(total)}${percent === 100 ? "\n" : ""}`);
    };
}

/**
 * A progress sink that emits one log line each time the download crosses another 10% (and at 100%); with an
 * unknown total, one line per 100 MB.
 */
export function logProgress(log: (line: string) => void, label: string): ProgressSink {
    /** The last tenth (0..10) reported, or for an unknown total the last 100 MB step. */
    let lastStep = -1;
    return (received, total) => {
        if (total === null || total === 0) {
            const step = Math.floor(received / 100e6);
            if (step > lastStep) {
                lastStep = step;
                log(`${label}: ${mb(received)} downloaded`);
            }
            return;
        }
        const step = Math.min(10, Math.floor((received / total) * 10));
        // The first call (resumed or 0 bytes) reports where the download starts.
        if (step > lastStep) {
            lastStep = step;
            log(`${label}: ${step * 10}% (${mb(received)} / ${mb(total)})`);
        }
    };
}

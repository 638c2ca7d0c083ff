/** IEEE-754 binary16 ("half", GGUF F16) conversion for the tensors Keel writes. */

const convF32 = new Float32Array(1);
const convU32 = new Uint32Array(convF32.buffer);

/**
 * Converts a number to IEEE-754 binary16 bits, rounding to nearest-even (via the float32 value).
 * Overflow gives +-Infinity, NaN stays NaN, tiny values become subnormals or signed zero.
 * @returns the 16-bit pattern as an unsigned integer
 */
export function floatToHalfBits(value: number): number {
    convF32[0] = value;
    const bits = convU32[0]!;
    const sign = (bits >>> 16) & 0x8000;
    const exp32 = (bits >>> 23) & 0xff;
    const frac32 = bits & 0x7fffff;
    if (exp32 === 0xff) return sign | 0x7c00 | (frac32 !== 0 ? 0x0200 : 0);
    const exp16 = exp32 - 112; // rebias 127 -> 15
    if (exp16 >= 0x1f) return sign | 0x7c00;
    if (exp16 <= 0) {
        // subnormal half (or zero): value = m * 2^-24 with the implicit leading 1 made explicit
        if (exp16 < -10) return sign;
        const m = frac32 | 0x800000;
        const shift = 14 - exp16; // 14..24
        let h = m >>> shift;
        const rest = m & ((1 << shift) - 1);
        const half = 1 << (shift - 1);
        if (rest > half || (rest === half && (h & 1) === 1)) h += 1;
        return sign | h;
    }
    let h = (exp16 << 10) | (frac32 >>> 13);
    const rest = frac32 & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (h & 1) === 1)) h += 1; // may carry into the exponent: correct
    return sign | h;
}

/** Converts binary16 bits back to a number (exact). */
export function halfBitsToFloat(bits: number): number {
    const sign = bits & 0x8000 ? -1 : 1;
    const exp = (bits >>> 10) & 0x1f;
    const frac = bits & 0x3ff;
    if (exp === 0) return sign * frac * 2 ** -24;
    if (exp === 0x1f) return frac ? NaN : sign * Infinity;
    return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

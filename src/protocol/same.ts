/**
 * Compile-time equality of two types, for checking the protocol's declared types against its schemas: `true` when
 * they are the same type (after flattening intersections, recursively), `never` otherwise, so that assigning `true`
 * to a `Same<A, B>` fails to compile the moment a schema and its type drift apart.
 */

/** A type with its intersections flattened into plain object types, recursively (functions and primitives as is). */
type Flat<T> = T extends (infer E)[] ? Flat<E>[] : T extends object ? { [K in keyof T]: Flat<T[K]> } : T;

/** Exact equality (the conditional-type identity test), so that an optional field present on one side only fails. */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;

export type Same<A, B> = Equal<Flat<A>, Flat<B>> extends true ? true : never;

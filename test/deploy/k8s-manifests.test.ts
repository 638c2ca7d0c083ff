/**
 * deploy/k8s: every document of every manifest validates against the shipped schema for its kind (ajv), and the
 * manifests agree with Keel itself: the Deployment's args are `keel serve` flags with valid values, the probes hit
 * Keel's health routes on the container's port, the Service and InferencePool select the Deployment's pods, and the
 * endpoint picker is pointed at metric names Keel exports.
 */
import fs from "node:fs";
import path from "node:path";
import { Ajv, type ValidateFunction } from "ajv";
import { parseAllDocuments } from "yaml";
import { describe, expect, it } from "vitest";
import { parseServeFlags } from "../../src/cli.js";
import { Metrics } from "../../src/gateway/metrics/metrics.js";
import { ROOT } from "../support/server.js";

const DIR = path.join(ROOT, "deploy", "k8s");
// strictRequired off: a probe's `oneOf: [{required: [httpGet]}, {required: [grpc]}]` names properties defined beside it.
const ajv = new Ajv({ allErrors: true, strict: true, strictRequired: false });
/** Schema validators by kind. */
const schemas = new Map<string, ValidateFunction>();
for (const f of fs.readdirSync(path.join(DIR, "schemas"))) {
  const schema = JSON.parse(fs.readFileSync(path.join(DIR, "schemas", f), "utf8")) as { $id: string };
  schemas.set(schema.$id, ajv.compile(schema));
}

type Doc = { kind: string; metadata: { name: string }; [k: string]: any };
/** Every YAML document of every manifest, parsed strictly (a YAML error fails). */
function manifests(): { file: string; doc: Doc }[] {
  const out: { file: string; doc: Doc }[] = [];
  for (const file of fs.readdirSync(DIR).filter((f) => f.endsWith(".yaml"))) {
    for (const d of parseAllDocuments(fs.readFileSync(path.join(DIR, file), "utf8"))) {
      expect(d.errors, `${file}: YAML errors`).toEqual([]);
      out.push({ file, doc: d.toJS() as Doc });
    }
  }
  return out;
}

/** Schema errors of `doc` ([] when valid); a kind without a shipped schema is an error too. */
function validate(doc: Doc): string[] {
  const v = schemas.get(doc.kind);
  if (!v) return [`no schema for kind ${doc.kind}`];
  return v(doc) ? [] : (v.errors ?? []).map((e) => `${e.instancePath} ${e.message}`);
}

const all = manifests();
const find = (kind: string, name: string): Doc => {
  const d = all.find((m) => m.doc.kind === kind && m.doc.metadata.name === name)?.doc;
  if (!d) throw new Error(`no ${kind} ${name} in deploy/k8s`);
  return d;
};

describe("deploy/k8s manifests validate against their kinds' schemas", () => {
  it("every document is valid", () => {
    expect(all.map((m) => m.doc.kind).sort()).toEqual(["ConfigMap", "Deployment", "Deployment", "InferencePool", "Secret", "Service", "Service"]);
    for (const { file, doc } of all) expect(validate(doc), `${file}: ${doc.kind} ${doc.metadata.name}`).toEqual([]);
  });

  it("the validator refuses what a broken manifest would hold (a probe without a path, a typo'd field, a bad port)", () => {
    const keel = structuredClone(find("Deployment", "keel"));
    const c = keel.spec.template.spec.containers[0];
    delete c.readinessProbe.httpGet.path;
    expect(validate(keel).join("\n")).toMatch(/readinessProbe\/httpGet must have required property 'path'/);
    const typo = structuredClone(find("InferencePool", "keel"));
    typo.spec.targetPort = typo.spec.targetPorts;
    expect(validate(typo).join("\n")).toMatch(/must NOT have additional properties/);
    const port = structuredClone(find("Service", "keel"));
    port.spec.ports[0].port = 70000;
    expect(validate(port).join("\n")).toMatch(/ports\/0\/port must be <= 65535/);
  });

  it("the endpoint picker's config (inside its ConfigMap) validates, and each profile names a declared plugin", () => {
    const text = find("ConfigMap", "keel-epp-config").data["epp-config.yaml"] as string;
    const [d] = parseAllDocuments(text);
    const cfg = d!.toJS() as Doc & { plugins: { type: string; name?: string }[]; schedulingProfiles: { plugins: { pluginRef: string }[] }[] };
    expect(validate(cfg)).toEqual([]);
    const declared = new Set(cfg.plugins.map((p) => p.name ?? p.type));
    for (const p of cfg.schedulingProfiles.flatMap((s) => s.plugins)) expect(declared.has(p.pluginRef), p.pluginRef).toBe(true);
  });
});

describe("the manifests agree with Keel", () => {
  const keel = find("Deployment", "keel");
  const pod = keel.spec.template;
  const c = pod.spec.containers[0];

  it("the Deployment's args are `keel serve` flags with values Keel accepts", () => {
    expect(c.args[0]).toBe("serve");
    const flags = parseServeFlags(c.args.slice(1));
    expect(flags["rest_port"]).toBe(8000);
    expect(flags["apiKeyFile"]).toBe("/etc/keel/api-key");
    expect(flags["allowedOrigins"]).toEqual(["*"]);
  });

  it("probes hit /v2/health/live and /v2/health/ready on the port Keel listens on", () => {
    const port = c.ports.find((p: { name: string }) => p.name === c.readinessProbe.httpGet.port).containerPort;
    expect(port).toBe(parseServeFlags(c.args.slice(1))["rest_port"]);
    expect(c.livenessProbe.httpGet.path).toBe("/v2/health/live");
    expect(c.readinessProbe.httpGet.path).toBe("/v2/health/ready");
    expect(c.startupProbe.httpGet.path).toBe("/v2/health/ready");
    // The key file is mounted from the Secret where --api_key_file points.
    const mount = c.volumeMounts.find((m: { name: string }) => m.name === "api-key");
    expect(path.posix.join(mount.mountPath, "api-key")).toBe(parseServeFlags(c.args.slice(1))["apiKeyFile"]);
    const secret = find("Secret", "keel-api-key");
    expect(Object.keys(secret.stringData)).toEqual(["api-key"]);
  });

  it("the Service and the InferencePool select the Deployment's pods on its port", () => {
    const matches = (sel: Record<string, string>): boolean => Object.entries(sel).every(([k, v]) => pod.metadata.labels[k] === v);
    expect(matches(find("Service", "keel").spec.selector)).toBe(true);
    const pool = find("InferencePool", "keel");
    expect(matches(pool.spec.selector.matchLabels)).toBe(true);
    expect(pool.spec.targetPorts.map((p: { number: number }) => p.number)).toEqual([c.ports[0].containerPort]);
    const epp = find("Service", pool.spec.endpointPickerRef.name);
    expect(epp.spec.ports[0].port).toBe(pool.spec.endpointPickerRef.port.number);
  });

  it("the endpoint picker is pointed at metric names Keel exports", async () => {
    const args: string[] = find("Deployment", "keel-epp").spec.template.spec.containers[0].args;
    const named = args.filter((a) => /^--[a-z-]+-metric=./.test(a)).map((a) => a.split("=")[1]!);
    expect(named).toEqual(["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"]);
    const m = new Metrics({
      counts: () => ({ waiting: 0, running: 0 }),
      activeSequences: () => 0,
      cachedSequences: () => 0,
      lastStepAgeSeconds: () => 0,
      models: () => [{ modelName: "smollm2", waiting: 0, running: 0, kvTokensInUse: 0, kvTokenCapacity: 8, cacheDtype: "f16", prefixCaching: true }],
    });
    const text = await m.registry.metrics();
    for (const name of named) expect(text).toMatch(new RegExp(`^${name}\\{model_name="smollm2"`, "m"));
  });
});

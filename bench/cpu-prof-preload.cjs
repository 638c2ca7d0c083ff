// Preloaded with NODE_OPTIONS=--require (node refuses --cpu-prof there): starts V8's sampling CPU profiler in this
// process and every node child that inherits the variable (Keel's engine), and writes
// $KEEL_CPU_PROF_DIR/<pid>-<script>.cpuprofile at exit. In-thread inspector sessions answer synchronously, so the
// profile can be taken in the 'exit' handler. Used by bench/profile-keel.mjs.
"use strict";
const inspector = require("node:inspector");
const fs = require("node:fs");
const path = require("node:path");
const dir = process.env.KEEL_CPU_PROF_DIR;
if (dir) {
  const session = new inspector.Session();
  session.connect();
  session.post("Profiler.enable");
  session.post("Profiler.setSamplingInterval", { interval: Number(process.env.KEEL_CPU_PROF_INTERVAL_US || 100) });
  session.post("Profiler.start");
  process.on("exit", () => {
    session.post("Profiler.stop", (err, res) => {
      if (err) return;
      const name = `${process.pid}-${path.basename(process.argv[1] || "node", ".js")}.cpuprofile`;
      fs.writeFileSync(path.join(dir, name), JSON.stringify(res.profile));
    });
  });
}

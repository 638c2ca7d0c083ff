#!/usr/bin/env node
// The `keel` command. The TypeScript sources are compiled to dist/ by `npm run build` (done by npm run serve/test).
import { main } from "../dist/cli.js";

await main(process.argv.slice(2));

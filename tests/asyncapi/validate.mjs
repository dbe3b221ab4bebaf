// Validates the AsyncAPI document read from stdin with the AsyncAPI project's
// parser (the one its CLI and generator use) and prints its diagnostics as JSON:
// [{severity, code, message, path}], severity 0 an error. Exit 0 either way;
// the test reads the list. Usage: node validate.mjs <folder holding node_modules>
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.resolve(process.argv[2], 'package.json'));
const { Parser } = require('@asyncapi/parser');

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const parser = new Parser();
const diagnostics = await parser.validate(Buffer.concat(chunks).toString('utf8'));
console.log(JSON.stringify(diagnostics.map(d => ({
  severity: d.severity, code: d.code, message: d.message, path: d.path.join('/'),
}))));

// Bench helper: prints {sha1: name} of BullMQ's Lua scripts and of apply.lua, so that the bench can name
// the EVALSHA calls it sees (MONITOR, SLOWLOG).
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const scripts = createRequire(import.meta.url)('./node_modules/bullmq/dist/cjs/scripts/index.js');

const sha = (text) => createHash('sha1').update(text).digest('hex');
const names = {};
for (const script of Object.values(scripts)) {
  if (script && typeof script.content === 'string') names[sha(script.content)] = `bullmq ${script.name}`;
}
names[sha(readFileSync(new URL('./apply.lua', import.meta.url), 'utf8'))] = 'applyShipment (apply.lua)';
console.log(JSON.stringify(names));

// The seed's apply.js: applyShipment(connection, batchId, rows) with ONE Lua script
// guarded by the batch's done marker (HINCRBY per row, generation counter).
import { readFileSync } from 'node:fs';
import { keys } from './config.js';

const source = readFileSync(new URL('./apply.lua', import.meta.url), 'utf8');

export function defineApply(connection) {
  connection.defineCommand('applyShipmentScript', { numberOfKeys: 3, lua: source });
}

export class BatchConflict extends Error {}

export async function applyShipment(connection, batchId, sha256, rows) {
  // One flat array (a spread of 200,000 arguments would overflow the call stack).
  const args = new Array(7 + 2 * rows.length);
  args[0] = keys.done(batchId);
  args[1] = keys.stock;
  args[2] = keys.generation;
  args[3] = batchId;
  args[4] = sha256;
  args[5] = rows.length;
  args[6] = Date.now();
  for (let i = 0; i < rows.length; i++) {
    args[7 + 2 * i] = rows[i][0];
    args[8 + 2 * i] = rows[i][1];
  }
  const [kind, result] = await connection.applyShipmentScript(args);
  if (kind === 'conflict') throw new BatchConflict(`batch ${batchId} was applied with other content`);
  return { ...JSON.parse(result), ...(kind === 'replayed' ? { replay: true } : {}) };
}

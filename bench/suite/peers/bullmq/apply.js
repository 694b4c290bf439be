// The seed's apply.js: applyShipment(connection, batchId, rows) with ONE Lua script
// guarded by the batch's done marker (HINCRBY per row, generation counter).
import { readFileSync } from 'node:fs';
import { keys } from './config.js';

const source = readFileSync(new URL('./apply.lua', import.meta.url), 'utf8');

export function defineApply(connection) {
  connection.defineCommand('applyShipmentScript', { numberOfKeys: 3, lua: source });
}

export class BatchConflict extends Error {}

// pairs: [sku, qty, sku, qty, ...] as parseShipment returns them.
export async function applyShipment(connection, batchId, sha256, pairs) {
  // One flat array (a spread of 200,000 arguments would overflow the call stack).
  const args = [keys.done(batchId), keys.stock, keys.generation, batchId, sha256, pairs.length / 2, Date.now()];
  const [kind, result] = await connection.applyShipmentScript(args.concat(pairs));
  if (kind === 'conflict') throw new BatchConflict(`batch ${batchId} was applied with other content`);
  return { ...JSON.parse(result), ...(kind === 'replayed' ? { replay: true } : {}) };
}

// The seed's worker.js: a BullMQ Worker (concurrency 16) that validates the CSV,
// reports progress 'validated', applies with one Lua script, reports 'committed'.
import { UnrecoverableError, Worker } from 'bullmq';
import { BatchConflict, applyShipment, defineApply } from './apply.js';
import { concurrency, connect, maxRows, prefix, queueName } from './config.js';
import { CONTRACT_VERSION } from './queue.js';
import { parseShipment } from './shipment.js';

const connection = connect('worker');
defineApply(connection);

async function processor(job) {
  const { contractVersion, batchId, uploadKey, sha256 } = job.data;
  if (contractVersion !== CONTRACT_VERSION) {
    throw new UnrecoverableError(`contract.unsupported_version: ${contractVersion}`);
  }
  const csv = await connection.getBuffer(uploadKey);
  if (csv === null) throw new UnrecoverableError('upload.missing');
  const parsed = parseShipment(csv, maxRows);
  if (!parsed.ok) throw new UnrecoverableError(`csv.invalid: ${JSON.stringify(parsed.issues.slice(0, 5))}`);
  const rows = parsed.rows;
  await job.updateProgress({ phase: 'validated', rows });
  let result;
  try {
    result = await applyShipment(connection, batchId, sha256, parsed.pairs);
  } catch (err) {
    if (err instanceof BatchConflict) throw new UnrecoverableError(`batch.conflict: ${err.message}`);
    throw err;
  }
  await job.updateProgress({ phase: 'committed', rows });
  return result;
}

const worker = new Worker(queueName, processor, { connection, prefix, concurrency });
worker.on('error', (error) => console.error('worker_error', error.message));
worker.on('failed', (job, error) => console.error('failed', job?.id, error.message));
worker.on('ready', () => console.log(`worker ready: queue ${queueName}, prefix ${prefix}, concurrency ${concurrency}`));

let closing = false;
async function shutdown() {
  if (closing) return;
  closing = true;
  await worker.close();
  await connection.quit();
}
process.on('SIGTERM', () => shutdown().catch(console.error));
process.on('SIGINT', () => shutdown().catch(console.error));

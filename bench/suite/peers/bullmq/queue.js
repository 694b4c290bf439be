// The queue and the producer's one use case: store the upload, queue.add (the seed's server.js).
import { createHash } from 'node:crypto';
import { Queue } from 'bullmq';
import { keepCompleted, keepFailed, keys, prefix, queueName, uploadTtlSeconds } from './config.js';

export const CONTRACT_VERSION = 1;
export const BATCH_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

export function createQueue(connection, options = {}) {
  return new Queue(queueName, {
    connection,
    prefix,
    defaultJobOptions: {
      attempts: 3,
      backoff: { type: 'exponential', delay: 1000 },
      removeOnComplete: keepCompleted,
      removeOnFail: keepFailed,
    },
    ...options,
  });
}

// The CSV is stored in Redis under its sha256 (content-addressed: a retry of the
// same POST writes the same key) and the job data carries the reference, so the
// queue message does not grow with the file. Two round trips: SET, then queue.add.
export async function submitImport(redis, queue, batchId, csv) {
  const sha256 = createHash('sha256').update(csv).digest('hex');
  const uploadKey = keys.upload(sha256);
  await redis.set(uploadKey, csv, 'EX', uploadTtlSeconds);
  const jobId = `shipment-${batchId}`;
  await queue.add(
    'import',
    { contractVersion: CONTRACT_VERSION, batchId, uploadKey, sha256 },
    { jobId, attempts: 3, backoff: { type: 'exponential', delay: 1000 } },
  );
  return { jobId, batchId, state: 'waiting' };
}

// Many shipments at once, BullMQ's bulk way: one pipeline of SET uploads, then
// one queue.addBulk (a MULTI of addStandardJob calls). shipments: [{batchId, csv}].
export async function submitImports(redis, queue, shipments) {
  const pipe = redis.pipeline();
  const jobs = shipments.map(({ batchId, csv }) => {
    const sha256 = createHash('sha256').update(csv).digest('hex');
    const uploadKey = keys.upload(sha256);
    pipe.set(uploadKey, csv, 'EX', uploadTtlSeconds);
    return {
      name: 'import',
      data: { contractVersion: CONTRACT_VERSION, batchId, uploadKey, sha256 },
      opts: { jobId: `shipment-${batchId}`, attempts: 3, backoff: { type: 'exponential', delay: 1000 } },
    };
  });
  await pipe.exec();
  await queue.addBulk(jobs);
  return shipments.map(({ batchId }) => ({ status: 202, body: { jobId: `shipment-${batchId}`, batchId, state: 'waiting' } }));
}

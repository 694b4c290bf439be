// Settings of the BullMQ peer, read once from the environment (the seed's config.js:
// connect, queueName, prefix). Every process (server, worker, enqueue) uses it.
import IORedis from 'ioredis';

const env = process.env;

export const redisUrl = env.PEER_REDIS_URL || 'redis://127.0.0.1:6379/0';
export const prefix = env.PEER_PREFIX || 'bull';
export const queueName = env.PEER_QUEUE || 'imports';
export const port = Number(env.PEER_PORT || 3000);
export const host = env.PEER_HOST || '127.0.0.1';
export const concurrency = Number(env.PEER_CONCURRENCY || 16);
export const maxBytes = Number(env.PEER_MAX_BYTES || 16 * 1024 * 1024);
export const maxRows = Number(env.PEER_MAX_ROWS || 100000);
export const uploadTtlSeconds = Number(env.PEER_UPLOAD_TTL || 86400);
// The seed's stage 12 retention; the bench raises the counts so every record stays,
// as it does for Importer.
export const keepCompleted = {
  age: Number(env.PEER_KEEP_COMPLETED_AGE || 3600),
  count: Number(env.PEER_KEEP_COMPLETED_COUNT || 100),
};
export const keepFailed = {
  age: Number(env.PEER_KEEP_FAILED_AGE || 86400),
  count: Number(env.PEER_KEEP_FAILED_COUNT || 100),
};

// Business keys (stock, generation, done markers, uploads) live beside the queue's keys.
export const keys = {
  stock: `${prefix}:stock`,
  generation: `${prefix}:generation`,
  done: (batchId) => `${prefix}:done:${batchId}`,
  upload: (sha256) => `${prefix}:upload:${sha256}`,
};

// One connection per role; BullMQ's Worker needs maxRetriesPerRequest: null.
export function connect(role) {
  return new IORedis(redisUrl, {
    connectionName: `peer-${role}`,
    maxRetriesPerRequest: role === 'worker' ? null : 3,
    enableReadyCheck: true,
  });
}

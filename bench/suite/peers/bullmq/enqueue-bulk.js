// Bench helper: enqueue N 3-row imports in bulk through submitImports (per
// chunk: one pipeline of SET uploads, one queue.addBulk), no worker running.
// Usage: node enqueue-bulk.js N TAG [chunk]
import { connect } from './config.js';
import { createQueue, submitImports } from './queue.js';

const n = Number(process.argv[2]);
const tag = process.argv[3] || 'd';
const chunk = Number(process.argv[4] || 100);
const redis = connect('producer');
const queue = createQueue(redis);

const csv = (i) => Buffer.from(`sku,quantity\nA${i % 997},1\nB${i % 991},2\nC${i % 983},3\n`);
for (let start = 0; start < n; start += chunk) {
  const shipments = [];
  for (let i = start; i < Math.min(n, start + chunk); i++) shipments.push({ batchId: `${tag}-${i}`, csv: csv(i) });
  await submitImports(redis, queue, shipments);
}
await queue.close();
await redis.quit();
console.log(`enqueued ${n}`);

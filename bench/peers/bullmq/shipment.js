// CSV validation, the same rules as Importer's domain/shipment.py: optional BOM,
// LF or CRLF, blank lines ignored, header sku,quantity (case-insensitive), a field
// may be wrapped in double quotes, SKU ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$, quantity
// digits 1..1,000,000, a SKU at most once, at most maxRows rows, issues capped at 100.
const SKU = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const DIGITS = /^[0-9]{1,7}$/;
export const MAX_QUANTITY = 1000000;
const MAX_ISSUES = 100;
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false });

function unquote(field) {
  let f = field.trim();
  if (f.length >= 2 && f[0] === '"' && f[f.length - 1] === '"') f = f.slice(1, -1).trim();
  return f;
}

// Returns { ok: true, rows: [[sku, qty], ...] } or { ok: false, issues: [...] }.
export function parseShipment(data, maxRows = 100000) {
  let text;
  try {
    text = typeof data === 'string' ? data : decoder.decode(data);
  } catch {
    return { ok: false, issues: [{ line: 1, code: 'csv.not_utf8', message: 'not valid UTF-8' }] };
  }
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const lines = text.split('\n');
  const issues = [];
  const add = (line, column, code, message) => { if (issues.length < MAX_ISSUES) issues.push({ line, column, code, message }); };
  const rows = [];
  const seen = new Map();
  let header = false;
  let count = 0;
  for (let i = 0; i < lines.length; i++) {
    let line = lines[i];
    if (line.endsWith('\r')) line = line.slice(0, -1);
    if (!line.trim()) continue;
    const fields = line.split(',');
    if (!header) {
      header = true;
      const names = fields.map((f) => unquote(f).toLowerCase());
      if (names.length !== 2 || names[0] !== 'sku' || names[1] !== 'quantity') {
        return { ok: false, issues: [{ line: i + 1, code: 'csv.bad_header', message: "expected 'sku,quantity'" }] };
      }
      continue;
    }
    count += 1;
    if (count > maxRows) { add(i + 1, null, 'csv.too_many_rows', `more than ${maxRows} rows`); break; }
    if (issues.length >= MAX_ISSUES) continue;
    if (fields.length !== 2) { add(i + 1, null, 'csv.bad_row', `${fields.length} columns, expected 2`); continue; }
    const sku = unquote(fields[0]);
    const qtyText = unquote(fields[1]);
    let ok = true;
    if (!SKU.test(sku)) { ok = false; add(i + 1, 1, 'csv.bad_sku', 'SKU is not valid'); }
    const qty = DIGITS.test(qtyText) ? Number(qtyText) : 0;
    if (qty < 1 || qty > MAX_QUANTITY) { ok = false; add(i + 1, 2, 'csv.bad_quantity', `quantity is not a whole number from 1 to ${MAX_QUANTITY}`); }
    if (!ok) continue;
    const first = seen.get(sku);
    if (first !== undefined) { add(i + 1, 1, 'csv.duplicate_sku', `SKU ${sku} already on line ${first}`); continue; }
    seen.set(sku, i + 1);
    rows.push([sku, qty]);
  }
  if (!header) return { ok: false, issues: [{ line: 1, code: 'csv.empty', message: 'the file has no header and no rows' }] };
  if (issues.length) return { ok: false, issues };
  if (!rows.length) return { ok: false, issues: [{ line: 1, code: 'csv.no_rows', message: 'the file has a header but no rows' }] };
  return { ok: true, rows };
}

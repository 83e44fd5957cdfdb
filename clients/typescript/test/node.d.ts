// The few Node.js APIs the tests use, declared here so that the package's
// only development dependency is typescript (no @types/node).
declare module "node:test" {
  interface TestContext {
    skip(message?: string): void;
    diagnostic(message: string): void;
  }
  interface TestOptions {
    timeout?: number;
    skip?: boolean | string;
  }
  type TestFn = (t: TestContext) => unknown;
  function test(name: string, fn: TestFn): Promise<void>;
  function test(name: string, options: TestOptions, fn: TestFn): Promise<void>;
  export function after(fn: () => unknown): void;
  export default test;
  export { test };
}

declare module "node:assert/strict" {
  function assert(value: unknown, message?: string): asserts value;
  namespace assert {
    function ok(value: unknown, message?: string): asserts value;
    function equal(actual: unknown, expected: unknown, message?: string): void;
    function notEqual(actual: unknown, expected: unknown, message?: string): void;
    function deepEqual(actual: unknown, expected: unknown, message?: string): void;
    function match(value: string, re: RegExp, message?: string): void;
    function rejects(p: Promise<unknown> | (() => Promise<unknown>), check?: unknown, message?: string): Promise<void>;
    function throws(fn: () => unknown, check?: unknown, message?: string): void;
    function fail(message?: string): never;
  }
  export default assert;
}

declare module "node:fs" {
  export function writeFileSync(path: string, data: string): void;
}

declare module "node:path" {
  export function join(...parts: string[]): string;
}

declare const process: { env: Record<string, string | undefined>; pid: number };

declare module "node:http" {
  interface IncomingMessage {
    method?: string;
    url?: string;
    on(event: "data", fn: (chunk: { toString(): string }) => void): this;
    on(event: "end", fn: () => void): this;
  }
  interface ServerResponse {
    writeHead(status: number, headers?: Record<string, string>): this;
    end(body?: string): void;
    on(event: "close", fn: () => void): this;
  }
  interface Server {
    listen(port: number, host: string, cb?: () => void): this;
    address(): { port: number } | string | null;
    close(cb?: (err?: Error) => void): this;
    closeAllConnections(): void;
  }
  function createServer(handler: (req: IncomingMessage, res: ServerResponse) => void): Server;
}

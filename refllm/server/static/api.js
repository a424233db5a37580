// Calls to the server's API, with the API key the page asked for (kept for this tab only).
"use strict";

const refllm = {
  model: null,

  headers() {
    const headers = { "Content-Type": "application/json" };
    const key = sessionStorage.getItem("refllm-key");
    if (key) headers.Authorization = "Bearer " + key;
    return headers;
  },

  // fetch(path) with the key; a 401 asks for the key and tries once more.
  async call(path, body) {
    const options = () => body === undefined
      ? { headers: this.headers() }
      : { method: "POST", headers: this.headers(), body: JSON.stringify(body) };
    let response = await fetch(path, options());
    if (response.status === 401) {
      await this.askForKey();
      response = await fetch(path, options());
    }
    if (!response.ok) {
      let message = response.status + " " + response.statusText;
      try { message = (await response.json()).error.message; } catch (_) { /* not OpenAI's error shape */ }
      throw new Error(message);
    }
    return response;
  },

  askForKey() {
    const dialog = document.getElementById("key-dialog");
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => {
        sessionStorage.setItem("refllm-key", document.getElementById("key").value);
        resolve();
      }, { once: true });
      dialog.showModal();
    });
  },

  // Server-sent events of a streamed completion: calls onChunk(parsed JSON) for each, until [DONE].
  async stream(path, body, onChunk) {
    const response = await this.call(path, body);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          onChunk(chunk);
        }
      }
    }
  },
};
